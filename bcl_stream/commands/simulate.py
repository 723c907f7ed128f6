"""``bcl-stream simulate``: score every strategy on a file of record lengths.

``--layout padded`` scores the padded layout (a pack costs B x its costliest record) and,
beside it, the packed layout on the same records, so the two can be compared: speedups are
against ``sequential`` in the same layout, ``vs_packed_seq`` against ``sequential`` packed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.cost import resolve
from bcl_stream.planner.order import DEFAULT_SHARD_GROUP
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.sim import (
    STRATEGIES,
    Metrics,
    SimConfig,
    schedules,
    score,
    shard_table,
    speedups,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate balance of every strategy on record lengths")
    p.add_argument("--lengths", required=True, help="1-D .npy of integer token counts")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--pack-size", type=int, default=8, help="records per pack B")
    p.add_argument("--window", type=int, default=16, help="packs per rank per window W")
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step G")
    p.add_argument("--cost-model", default="llama3-8b", help="preset name or cost-model JSON")
    p.add_argument("--max-tokens", type=int, default=None, help="memory cap / MFFD bin capacity M")
    p.add_argument("--sync", choices=["microbatch", "step"], default="microbatch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--overhead", type=float, default=0.0, help="fixed cost per micro-batch")
    p.add_argument(
        "--shard-records",
        type=int,
        default=4096,
        help="the array is the dataset in write order, cut into shards of K records",
    )
    p.add_argument("--no-shuffle", action="store_true", help="stream in write order")
    p.add_argument(
        "--shard-group",
        type=int,
        default=DEFAULT_SHARD_GROUP,
        help="shards a node shuffles together (shuffle quality vs shard cache)",
    )
    p.add_argument(
        "--carry", type=int, default=None, help="carry-over records per rank (default W*B/4)"
    )
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="packed",
        help="packed: pack cost = sum of record costs; padded: B x costliest record "
        "(also reports the packed layout and the padding waste)",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--plot", type=Path, default=None, help="PNG of per-step cost across ranks")
    p.set_defaults(run=run)


def load_lengths(path: str) -> np.ndarray:
    try:
        lengths = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--lengths {path}: cannot load a .npy array ({exc})") from None
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"--lengths {path}: need a 1-D integer array, got {lengths.dtype} {lengths.shape}"
        )
    if lengths.size == 0:
        raise ValueError(f"--lengths {path}: the array is empty")
    return lengths


def run(args: argparse.Namespace) -> int:
    lengths = load_lengths(args.lengths)
    model = resolve(args.cost_model)
    config = SimConfig(
        ranks=args.ranks,
        ranks_per_node=args.ranks_per_node,
        pack_size=args.pack_size,
        window=args.window,
        grad_accum=args.grad_accum,
        max_tokens=args.max_tokens,
        sync=args.sync,
        seed=args.seed,
        epoch=args.epoch,
        overhead=args.overhead,
        shard_records=args.shard_records,
        shuffle=not args.no_shuffle,
        shard_group=args.shard_group,
        carry=args.carry,
        layout=args.layout,
    )
    names = tuple(s for s in args.strategies.split(",") if s)
    table = shard_table(lengths, model.cost(lengths), config.shard_records)
    planned = schedules(lengths, model, config, names)
    layouts = {args.layout: (planned, score(planned, config, table))}
    if args.layout == "padded":
        packed = dataclasses.replace(config, layout="packed")
        packed_plans = schedules(lengths, model, packed, names)
        layouts = {"packed": (packed_plans, score(packed_plans, packed, table)), **layouts}
    results = layouts[args.layout][1]
    versus = speedups(planned, config)  # per unit of cost, over nemo_mffd / verl_kk if present
    if args.plot is not None:
        from bcl_stream.plots import plot_step_costs

        plot_step_costs({name: s.pack_costs for name, s in planned.items()}, args.plot)
    if args.json:
        settings = {key: getattr(config, key) for key in SimConfig.__slots__}
        payload: dict[str, Any] = {
            "config": {**settings, "cost_model": model.to_dict(), "records": int(lengths.size)},
            "strategies": {name: m.to_dict() for name, m in results.items()},
        }
        if any(versus.values()):
            payload["speedup_vs"] = versus
        if len(layouts) > 1:
            payload["layouts"] = {
                layout: {name: m.to_dict() for name, m in scored.items()}
                for layout, (_, scored) in layouts.items()
            }
        print(json.dumps(payload))
        return 0
    packed_seq = layouts["packed"][1].get("sequential") if len(layouts) > 1 else None
    for layout, (plans, scored) in layouts.items():
        if len(layouts) > 1:
            print(f"layout {layout}")
        print_table(scored, speedups(plans, config), packed_seq)
    return 0


def print_table(
    results: dict[str, Metrics],
    versus: dict[str, dict[str, float]],
    packed_seq: Metrics | None,
) -> None:
    """One row per strategy; ``waste`` and ``vs_packed_seq`` only when layouts are compared."""
    base = results.get("sequential")
    peers = sorted({p for v in versus.values() for p in v}, key=list(STRATEGIES).index)
    extra = f"{'waste':>7}{'vs_packed_seq':>14}" if packed_seq else ""
    print(
        f"{'strategy':<18}{'efficiency':>11}{'cv_ranks':>10}{'cv_time':>9}{'speedup':>9}"
        f"{'packs':>7}{'left':>7}{'dl_amp':>8}{'shards':>8}"
        + "".join(f"{'vs ' + p:>14}" for p in peers)
        + extra
    )
    for name, m in results.items():
        speed = base.time / m.time if base and m.time else float("nan")
        row = (
            f"{name:<18}{m.efficiency:>11.3f}{m.cv_ranks:>10.3f}{m.cv_time:>9.3f}"
            f"{speed:>9.3f}{m.packs_per_rank:>7}{m.records_left:>7}"
            f"{m.download_amplification:>8.2f}{m.shard_working_set:>8}"
            + "".join(f"{versus[name][p]:>14.3f}" for p in peers)
        )
        if packed_seq:
            vs = packed_seq.time / m.time if m.time else float("nan")
            row += f"{m.padding_waste:>7.3f}{vs:>14.3f}"
        print(row)
