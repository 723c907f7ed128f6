"""Planning at scale, the measurement ``tools/bench_plan_scale.py`` and
``tools/bench_scale_out.py --process-only`` share: what one reader process plans, how long it
takes and how much private memory it holds, and the job shape both scale benchmarks run.

One row per process: ``python -m bcl_bench.plan_scale COSTS.npy SCOPE NODES [RANKS_PER_NODE]``
prints it as one JSON line (run it through ``harness.run_on_one_core``, one core, thread pools
of 1), so a row's caches and memory peak never leak into the next.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.analysis.sim import SimConfig, plan_config
from bcl_stream.cost import get_preset
from bcl_stream.planner import ShardTable, build_node_streams, plan_windows
from bcl_stream.planner.shard_table import shard_weights

RANKS, PER_NODE, PACK, WINDOW, SHARD = 64, 8, 8, 16, 4096
BATCH_WINDOWS = 64


def job(nodes: int, per_node: int, **fields: Any) -> SimConfig:
    """The scale benchmarks' job on ``nodes`` x ``per_node`` data-parallel ranks: B=8, W=16,
    shards of 4096 records; ``fields``: any other simulated setting (``grad_accum``...)."""
    return SimConfig(
        ranks=nodes * per_node,
        ranks_per_node=per_node,
        pack_size=PACK,
        window=WINDOW,
        shard_records=SHARD,
        **fields,
    )


def private_rss() -> int:
    """Resident bytes that are not file-backed (the mapped cost array is file-backed)."""
    import psutil

    info = psutil.Process().memory_info()
    return int(info.rss - info.shared)


def write_costs(n: int, path: Path) -> None:
    """Lognormal lengths (median ~450 tokens, capped at 8192) -> llama3-8b costs, float32."""
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
    base_rss = private_rss()
    t0 = time.perf_counter()
    costs = np.load(path, mmap_mode="r")
    n = int(costs.shape[0])
    counts = [SHARD] * (n // SHARD) + ([n % SHARD] if n % SHARD else [])
    table = ShardTable.build(counts, weight=shard_weights(counts, costs))
    config = plan_config(job(nodes, per_node, grad_accum=1), scope)
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


def main(argv: list[str]) -> int:
    """The child: ``COSTS.npy SCOPE NODES [RANKS_PER_NODE]`` -> one JSON row on stdout."""
    path, scope, nodes, *rest = argv
    per_node = int(rest[0]) if rest else PER_NODE
    print(json.dumps(measure(Path(path), scope, int(nodes), per_node)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
