"""Planning at scale: is planning linear in N, and does a process's memory stay O(window)?

For N in (1M, 10M, 100M) records (lognormal SFT-like lengths, llama3-8b costs, shards of 4096
records, written to a temporary .npy and memory-mapped as readers map the cost index), one
process per measurement plans what a reader process of ``--nodes`` nodes x 8 ranks (default 8
nodes: 64 ranks) would plan:

- ``rank``: rank 0's own windows (scope rank, W=16, B=8), the whole epoch, batch by batch;
- ``node``: node 0's windows (scope node: the 8 ranks of node 0 jointly);
- ``world``: row 0's windows: node 0's where a node holds 8 ranks and enough data (planner v2
  planned every node's windows in every process, 31 s to the first pack at 128 nodes); with
  ``--ranks-per-node 1`` (tensor parallelism) planner v4's row of 8 nodes.

Reported per (N, scope): set-up time (map the costs, per-shard means in one chunked pass,
streams), time to the first pack, steady planning throughput in records planned per second
(the packs of every rank this process plans: 1, 8 or 64 ranks), planning time per record
planned and per record of the process's own rank (a row of 8 ranks costs its process 8 records
planned per own record), peak and final private RSS (resident memory that is not the file-backed mapping of the cost array)
per process, and private RSS per record of the dataset. One core: thread pools are limited to 1.

Usage::

    python tools/bench_plan_scale.py                 # 1M, 10M, 100M (about 10 minutes)
    python tools/bench_plan_scale.py --sizes 1e6 1e7 # a quicker run
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from one_core import run_on_one_core

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RANKS, PER_NODE, PACK, WINDOW, SHARD = 64, 8, 8, 16, 4096
BATCH_WINDOWS = 64


def private_rss() -> int:
    """Resident bytes that are not file-backed (the mapped cost array is file-backed)."""
    import psutil

    info = psutil.Process().memory_info()
    return int(info.rss - info.shared)


def write_costs(n: int, path: Path) -> None:
    """Lognormal lengths (median ~450 tokens, capped at 8192) -> llama3-8b costs, float32."""
    from bcl_stream.cost import get_preset

    model = get_preset("llama3-8b")
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n,))
    rng = np.random.default_rng(0)
    for lo in range(0, n, 1 << 22):
        size = min(1 << 22, n - lo)
        tok = np.minimum(rng.lognormal(6.1, 1.0, size).astype(np.int64) + 1, 8192)
        out[lo : lo + size] = model.cost(tok)
    out.flush()
    del out


def measure(
    path: Path, scope: str, nodes: int = RANKS // PER_NODE, per_node: int = PER_NODE
) -> dict[str, Any]:
    """One process: map, set up, plan this process's windows; timings and private RSS."""
    from bcl_stream.planner import PlanConfig, ShardTable, build_node_streams, plan_windows
    from bcl_stream.planner.shard_table import shard_weights

    base_rss = private_rss()
    t0 = time.perf_counter()
    costs = np.load(path, mmap_mode="r")
    n = int(costs.shape[0])
    counts = [SHARD] * (n // SHARD) + ([n % SHARD] if n % SHARD else [])
    table = ShardTable.build(counts, weight=shard_weights(counts, costs))
    config = PlanConfig(
        world_size=nodes * per_node,
        ranks_per_node=per_node,
        pack_size=PACK,
        window=WINDOW,
        scope=scope,
    )
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    setup_s = time.perf_counter() - t0
    rows = [0]  # what a reader of rank 0 plans: its own row
    t1 = time.perf_counter()
    first = plan_windows(streams, costs, None, rows, 0, 1)
    first_pack_s = time.perf_counter() - t1
    peak = private_rss()
    carry = first.carry
    t2 = time.perf_counter()
    planned_packs = first.packs.shape[1]
    for start in range(1, streams.n_windows, BATCH_WINDOWS):
        stop = min(start + BATCH_WINDOWS, streams.n_windows)
        batch = plan_windows(streams, costs, None, rows, start, stop, carry)
        carry = batch.carry
        planned_packs += batch.packs.shape[1]
        peak = max(peak, private_rss())
    steady_s = time.perf_counter() - t2
    ranks_planned = streams.config.row_ranks
    steady_records = (planned_packs - first.packs.shape[1]) * PACK * ranks_planned
    final = private_rss()
    own = planned_packs * PACK * ranks_planned
    return {
        "records": n,
        "nodes": nodes,
        "scope": scope,
        "ranks_per_node": per_node,
        "planning_us_per_own_record": 1e6 * (first_pack_s + steady_s) / own if own else 0.0,
        "planning_us_per_rank_record": (
            1e6 * (first_pack_s + steady_s) / (planned_packs * PACK) if planned_packs else 0.0
        ),
        "ranks_planned": ranks_planned,
        "setup_s": setup_s,
        "time_to_first_pack_s": setup_s + first_pack_s,
        "first_window_s": first_pack_s,
        "steady_s": steady_s,
        "records_planned": int(planned_packs * PACK * ranks_planned),
        "records_planned_per_s": steady_records / steady_s if steady_s > 0 else float("nan"),
        "private_rss_base_mb": base_rss / 2**20,
        "private_rss_peak_mb": peak / 2**20,
        "private_rss_final_mb": final / 2**20,
        "private_rss_growth_mb": (peak - base_rss) / 2**20,
        "private_bytes_per_record": (peak - base_rss) / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    parser.add_argument("--scopes", nargs="+", default=["rank", "node", "world"])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_plan_scale.json")
    parser.add_argument("--nodes", nargs="+", type=int, default=[RANKS // PER_NODE])
    parser.add_argument("--ranks-per-node", type=int, default=PER_NODE)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # PATH SCOPE NODES [P]
    args = parser.parse_args(argv)
    if args.child:
        path, scope, nodes, *rest = args.child
        per_node = int(rest[0]) if rest else PER_NODE
        print(json.dumps(measure(Path(path), scope, int(nodes), per_node)))
        return 0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bcl_scale_") as tmp:
        for size in args.sizes:
            n = int(size)
            path = Path(tmp) / f"costs_{n}.npy"
            write_costs(n, path)
            for nodes, scope in [(k, s) for k in args.nodes for s in args.scopes]:
                child = ["--child", str(path), scope, str(nodes), str(args.ranks_per_node)]
                row = run_on_one_core(__file__, child, ROOT)
                rows.append(row)
                print(
                    f"{n:>11,} {nodes:>4} nodes {scope:<6} setup {row['setup_s']:6.2f}s  first pack "
                    f"{row['time_to_first_pack_s']:6.2f}s  planned {row['records_planned_per_s'] / 1e6:5.2f}M"
                    f" records/s ({row['ranks_planned']} ranks)  private RSS peak "
                    f"{row['private_rss_growth_mb']:7.1f} MB ({row['private_bytes_per_record']:.2f} B/rec)",
                    flush=True,
                )
            path.unlink()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "setting": {
            "nodes": args.nodes,
            "ranks_per_node": args.ranks_per_node,
            "pack_size": PACK,
            "window": WINDOW,
            "shard_records": SHARD,
            "batch_windows": BATCH_WINDOWS,
            "cost_model": "llama3-8b",
            "machine": platform.processor() or platform.machine(),
            "cores_used": 1,
        },
        "rows": rows,
    }
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
