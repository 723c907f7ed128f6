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

import tempfile
from pathlib import Path
from typing import Any

from bcl_bench import plan_scale
from bcl_bench.harness import RESULTS, bench_parser, run_on_one_core, write_result
from bcl_bench.plan_scale import BATCH_WINDOWS, PACK, PER_NODE, RANKS, SHARD, WINDOW


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_plan_scale.json")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    parser.add_argument("--scopes", nargs="+", default=["rank", "node", "world"])
    parser.add_argument("--nodes", nargs="+", type=int, default=[RANKS // PER_NODE])
    parser.add_argument("--ranks-per-node", type=int, default=PER_NODE)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bcl_scale_") as tmp:
        for size in args.sizes:
            n = int(size)
            path = Path(tmp) / f"costs_{n}.npy"
            plan_scale.write_costs(n, path)
            for nodes, scope in [(k, s) for k in args.nodes for s in args.scopes]:
                child = [str(path), scope, str(nodes), str(args.ranks_per_node)]
                row = run_on_one_core(["-m", plan_scale.__name__, *child])
                rows.append(row)
                print(
                    f"{n:>11,} {nodes:>4} nodes {scope:<6} setup {row['setup_s']:6.2f}s  first pack "
                    f"{row['time_to_first_pack_s']:6.2f}s  planned {row['records_planned_per_s'] / 1e6:5.2f}M"
                    f" records/s ({row['ranks_planned']} ranks)  private RSS peak "
                    f"{row['private_rss_growth_mb']:7.1f} MB ({row['private_bytes_per_record']:.2f} B/rec)",
                    flush=True,
                )
            path.unlink()
    payload = {
        "setting": {
            "nodes": args.nodes,
            "ranks_per_node": args.ranks_per_node,
            "pack_size": PACK,
            "window": WINDOW,
            "shard_records": SHARD,
            "batch_windows": BATCH_WINDOWS,
            "cost_model": "llama3-8b",
            "cores_used": 1,
        },
        "rows": rows,
    }
    write_result(payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
