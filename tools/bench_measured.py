"""Measured balance: time every simulated rank's packs for real, not only in the cost model.

For R simulated ranks (default 8), the same records of a real corpus (the standard-library
chat corpus, cl100k token counts; token *values* are random ids, compute does not depend on
them) are planned by ``sequential``, the real peers ``nemo_mffd`` (NeMo-RL's packing),
``verl_kk`` (verl's ``balance_batch``) and ``hf_rebalance`` (Transformers'
``BatchRebalanceSampler``), ``bcl-rank`` and ``bcl-world`` with the planner itself
(``bcl_stream.planner``), BCL once with the ``tokens`` cost model and once with
a model calibrated on this machine (``bcl_stream.analysis.calibrate``). Then TinyGPT's forward+backward
runs on every pack, one after another in this process, and the step time is the max over
ranks of the measured pack times, exactly as a synchronous DDP step would wait.

Timing discipline on a shared 2-core machine: one torch thread; CPU clock of this process
(other engineers' jobs do not count; wall times are recorded too); every distinct pack timed
``repeats`` times, strategies interleaved in a shuffled order per round; medians kept.

    python tools/bench_measured.py --quick          # < 3 min, prints one JSON object
    python tools/bench_measured.py                  # the README figures (~10 min)

Writes results/bench_measured.json and results/bench_measured.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_bench.corpora import stdlib_lengths
from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_stream.analysis.calibrate import (
    CalibrationConfig,
    calibrate,
    make_step,
    time_packs,
)
from bcl_stream.analysis.metrics import imbalance_sq
from bcl_stream.analysis.sim import default_capacity
from bcl_stream.commands.calibrate import DEMO_MODEL
from bcl_stream.cost import CostModel, get_preset
from bcl_stream.peers import REAL_PEERS, Pool, global_order, plan_pooled
from bcl_stream.planner import PlanConfig, ShardTable, plan_epoch, shard_weights

Packs = list[list[npt.NDArray[np.int64]]]  # [rank][step] -> record ids


def load_lengths(path: str | None, max_len: int) -> npt.NDArray[np.int64]:
    """A corpus' token counts, records longer than the model's max_seq_len clipped (reported)."""
    if path:
        lengths = np.load(path, allow_pickle=False).astype(np.int64)
    else:
        lengths = stdlib_lengths("cl100k")
    return np.minimum(lengths, max_len)


def plan_all(
    tokens: npt.NDArray[np.int64],
    models: dict[str, CostModel],
    args: argparse.Namespace,
) -> tuple[dict[str, Packs], dict[str, str], int]:
    """Every strategy's packs on the same first N records of the epoch order."""
    per_rank = args.packs_per_rank * args.pack_size
    order = global_order(tokens.size, args.seed, 0)[: args.ranks * per_rank]
    sub = tokens[order]  # the records measured, as one shard; plans map back through ``order``
    out: dict[str, Packs] = {}
    planned_with: dict[str, str] = {}
    one_node = PlanConfig(
        world_size=args.ranks, ranks_per_node=args.ranks, pack_size=args.pack_size,
        window=args.window,
    )  # fmt: skip
    sub_costs = sub.astype(np.float64)
    table = ShardTable.build([sub.size], weight=shard_weights([sub.size], sub_costs))
    seq = plan_epoch(sub_costs, table, one_node, seed=args.seed, balanced=False)
    out["sequential"] = [list(rank) for rank in order[seq.packs]]
    planned_with["sequential"] = "none"
    capacity = default_capacity(tokens[order], args.pack_size)
    hows = {
        "nemo_mffd": "tokens (NeMo-RL MFFD bins)",
        "verl_kk": "verl workload (KK)",
        "hf_rebalance": "lengths, padded cost (Transformers)",
    }
    for peer, how in ((p, hows[p]) for p in REAL_PEERS):
        pool = Pool(order, tokens, args.ranks, args.pack_size, args.grad_accum)
        bins, _ = plan_pooled(peer, pool, capacity)
        out[peer] = [list(rank) for rank in bins]
        planned_with[peer] = how
    for label, model in models.items():
        costs = model.cost(sub)
        model_table = ShardTable.build([sub.size], weight=shard_weights([sub.size], costs))
        for scope in ("rank", "world"):
            config = dataclasses.replace(one_node, scope=scope)
            plan = plan_epoch(costs, model_table, config, seed=args.seed, tokens=sub)
            name = f"bcl-{scope}" if label == "calibrated" else f"bcl-{scope}:{label}"
            out[name] = [list(rank) for rank in order[plan.packs]]
            planned_with[name] = label
    return out, planned_with, int(order.size)


def efficiency(matrix: npt.NDArray[np.float64]) -> float:
    """docs/metrics.md: sum_t mean_r C / sum_t max_r C, ranks padded with 0 where bins are missing."""
    return float(matrix.mean(axis=0).sum() / matrix.max(axis=0).sum())


def as_matrix(per_rank: list[list[float]]) -> npt.NDArray[np.float64]:
    steps = max(len(r) for r in per_rank)
    out = np.zeros((len(per_rank), steps))
    for r, values in enumerate(per_rank):
        out[r, : len(values)] = values
    return out


def measure(
    plans: dict[str, Packs], tokens: npt.NDArray[np.int64], args: argparse.Namespace
) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]]:
    """Median CPU and wall seconds of every distinct pack (strategies interleaved)."""
    import torch

    from bcl_stream.loading.collate import collate_packed
    from lightning_module.tinygpt import TinyGPT

    unique = sorted({tuple(sorted(p.tolist())) for ps in plans.values() for r in ps for p in r})
    rng = np.random.default_rng(args.seed + 7)
    batches = [
        collate_packed(
            [
                {"input_ids": rng.integers(0, 100_000, tokens[i]).astype(np.uint32), "sample_id": i}
                for i in key
            ]
        )
        for key in unique
    ]
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    step = make_step(TinyGPT())
    cpu = time_packs(step, batches, repeats=args.repeats, warmup=3, seed=args.seed, clock="cpu")
    wall_s: dict[tuple[int, ...], float] = {}
    if not args.quick:  # one extra round on the wall clock, for comparison only
        wall = time_packs(step, batches, repeats=1, warmup=0, seed=args.seed + 1, clock="wall")
        wall_s = {k: float(v) for k, v in zip(unique, wall[:, 0], strict=True)}
    return {k: float(v) for k, v in zip(unique, np.median(cpu, axis=1), strict=True)}, wall_s


def score(
    plans: dict[str, Packs],
    planned_with: dict[str, str],
    seconds: dict[tuple[int, ...], float],
    wall: dict[tuple[int, ...], float],
    tokens: npt.NDArray[np.int64],
    models: dict[str, CostModel],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, ranks in plans.items():
        key = [[tuple(sorted(p.tolist())) for p in r] for r in ranks]
        measured = as_matrix([[seconds[k] for k in r] for r in key])
        model = models.get(planned_with[name], models["calibrated"])
        predicted = as_matrix([[float(model.cost(tokens[p]).sum()) for p in r] for r in ranks])
        calibrated = as_matrix(
            [[float(models["calibrated"].cost(tokens[p]).sum()) for p in r] for r in ranks]
        )
        squares = as_matrix([[float(np.sum(tokens[p] ** 2)) for p in r] for r in ranks])
        out[name] = {
            "planned_with": planned_with[name],
            "imbalance_sq": imbalance_sq(squares),
            "measured_efficiency": efficiency(measured),
            "predicted_efficiency": efficiency(predicted),
            "predicted_efficiency_calibrated": efficiency(calibrated),
            "measured_time_s": float(measured.max(axis=0).sum()),
            "predicted_time_s_calibrated": float(calibrated.max(axis=0).sum()),
            "steps": int(measured.shape[1]),
            "records": int(sum(p.size for r in ranks for p in r)),
            "step_times_s": measured.max(axis=0).tolist(),
        }
        if wall:
            measured_wall = as_matrix([[wall[k] for k in r] for r in key])
            out[name]["measured_efficiency_wall"] = efficiency(measured_wall)
            out[name]["measured_time_s_wall"] = float(measured_wall.max(axis=0).sum())
    for base in ("sequential", *REAL_PEERS):
        for entry in out.values():
            entry[f"measured_speedup_vs_{base}"] = out[base]["measured_time_s"] / max(
                entry["measured_time_s"], 1e-12
            )
            entry[f"predicted_speedup_vs_{base}"] = out[base]["predicted_time_s_calibrated"] / max(
                entry["predicted_time_s_calibrated"], 1e-12
            )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["strategies"])
    s = result["strategies"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    x = np.arange(len(names))
    ax1.bar(x - 0.2, [s[n]["measured_efficiency"] for n in names], 0.4, label="measured (CPU s)")
    ax1.bar(x + 0.2, [s[n]["predicted_efficiency"] for n in names], 0.4, label="predicted")
    ax1.set_xticks(x, names, rotation=30, ha="right")
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("balance efficiency")
    ax1.legend(loc="lower left")
    ax1.set_title(f"{result['config']['ranks']} simulated ranks, TinyGPT on this CPU")
    for n in names:
        ax2.plot(s[n]["step_times_s"], marker=".", label=n)
    ax2.set_xlabel("step")
    ax2.set_ylabel("step time = max over ranks (s)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, RESULTS / "bench_measured.json", quick="small settings, < 3 min")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--pack-size", type=int, default=None, help="B (default 8, quick 4)")
    p.add_argument("--window", type=int, default=None, help="W (default 8, quick 4)")
    p.add_argument("--packs-per-rank", type=int, default=None, help="steps (default 8, quick 4)")
    p.add_argument("--grad-accum", type=int, default=None, help="peers' global batch = R*B*G")
    p.add_argument("--repeats", type=int, default=None, help="timings per pack (3, quick 2)")
    p.add_argument("--lengths", default=None, help=".npy token counts (default: stdlib corpus)")
    p.add_argument("--cost-model", default=None, help="calibrated JSON (default: calibrate now)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    quick = args.quick
    for name, full, small in (
        ("pack_size", 8, 4),
        ("window", 8, 4),
        ("packs_per_rank", 8, 4),
        ("repeats", 3, 2),
    ):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.grad_accum is None:
        args.grad_accum = args.packs_per_rank
    started = time.time()
    from lightning_module.tinygpt import TinyGPTConfig

    tokens = load_lengths(args.lengths, TinyGPTConfig().max_seq_len)
    calibration: dict[str, Any] = {}
    if args.cost_model:
        calibrated = CostModel.load(args.cost_model)
        calibration = {"from": args.cost_model}
    else:
        cfg = CalibrationConfig(
            pack_size=args.pack_size,
            n_packs=24 if quick else 48,
            repeats=2 if quick else 3,
            max_tokens=int(min(tokens.max(), 4096)),
            pack_tokens=int(max(args.pack_size * 16, np.percentile(tokens, 99) * 2)),
            seed=args.seed,
        )
        fit = calibrate(DEMO_MODEL, cfg, lengths=tokens)
        calibrated = fit.fit.model
        calibration = {
            k: v for k, v in fit.report().items() if k not in ("packs", "cost_model", "settings")
        }
        calibration["settings"] = {"n_packs": cfg.n_packs, "repeats": cfg.repeats}
    models = {"tokens": get_preset("tokens"), "calibrated": calibrated}
    plans, planned_with, n_records = plan_all(tokens, models, args)
    seconds, wall = measure(plans, tokens, args)
    strategies = score(plans, planned_with, seconds, wall, tokens, models)
    bcl = {n: s for n, s in strategies.items() if n.startswith("bcl-")}
    best = {
        peer: max(bcl, key=lambda n, p=peer: bcl[n][f"measured_speedup_vs_{p}"])
        for peer in REAL_PEERS
    }
    result = {
        "config": {
            "ranks": args.ranks,
            "pack_size": args.pack_size,
            "window": args.window,
            "packs_per_rank": args.packs_per_rank,
            "grad_accum": args.grad_accum,
            "repeats": args.repeats,
            "records": n_records,
            "corpus": args.lengths or "stdlib chat corpus (cl100k)",
            "model": "TinyGPT defaults, packed layout, 1 torch thread, CPU clock",
            "quick": quick,
        },
        "cost_models": {k: m.to_dict() for k, m in models.items()},
        "calibration": calibration,
        "strategies": strategies,
        "best_bcl_vs_peers": {
            peer: {"strategy": n, "measured_speedup": bcl[n][f"measured_speedup_vs_{peer}"]}
            for peer, n in best.items()
        },
        "distinct_packs_timed": len(seconds),
        "elapsed_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.cost_model:  # keep the model these figures used, for bench_ddp and readers
        calibrated.save(args.out.with_suffix(".cost_model.json"))
    write_result(result, args.out, plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
