"""Per-process planning cost of the token contract beside the record contract's, in node count.

What one reader process plans, measured the way ``bcl_bench.plan_scale`` measures the record
contract (one process per row, pinned to one core, thread pools of 1): map the index, set up
the streams (under ``tokens`` as a reader does, ``build_token_streams``: also the geometry, the
mean fed length, and the memory cap's pass over the token counts), plan the process's own row
window by window. The two contracts differ only in the
packing: the record contract's ``plan_windows`` against the token contract's
``TokenWalker.walk`` over the same row of the same streams' shape.

Both plan about :data:`STEADY_RECORDS` records after the first window (the cost per record is
read on that steady part; the whole epoch of a 1-node row would plan every record of the
dataset in one process, which says nothing about scale), so a row is the same work at every
node count and a flat line means the planner's per-record cost does not grow with the job.

One row per process: ``python -m bcl_bench.token_scale TOKENS.npy COSTS.npy CONTRACT SCOPE
NODES [RANKS_PER_NODE]`` prints it as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import plan_scale
from bcl_bench.plan_scale import PER_NODE, SHARD, private_rss
from bcl_stream.analysis.sim import SimConfig, plan_config
from bcl_stream.cost import get_preset
from bcl_stream.planner import ShardTable, build_node_streams, build_token_streams, plan_windows
from bcl_stream.planner.shard_table import shard_weights
from bcl_stream.planner.token_contract import TokenWalker

ACCUM, MAX_TOKENS, CAP = 4, 16_384, 8192
STEADY_RECORDS = 100_000
"""Records of the row planned after the first window (both contracts; whole windows, so a
little more), enough for the steady time per record to rise well above the timer's noise."""


def write_index(n: int, tokens_path: Path, costs_path: Path) -> None:
    """Lognormal lengths (``plan_scale.write_costs``'s: median ~450 tokens, capped at 8192),
    int32 tokens and llama3-8b float32 costs, as the cost index stores them."""
    model = get_preset("llama3-8b")
    tok_out = np.lib.format.open_memmap(tokens_path, mode="w+", dtype=np.int32, shape=(n,))
    cost_out = np.lib.format.open_memmap(costs_path, mode="w+", dtype=np.float32, shape=(n,))
    rng = np.random.default_rng(0)
    for lo in range(0, n, 1 << 22):
        size = min(1 << 22, n - lo)
        tok = np.minimum(rng.lognormal(6.1, 1.0, size).astype(np.int64) + 1, CAP)
        tok_out[lo : lo + size] = tok
        cost_out[lo : lo + size] = model.cost(tok)
    tok_out.flush()
    cost_out.flush()


def job(contract: str, nodes: int, per_node: int) -> SimConfig:
    """The job: B=8, W=16, G=4, shards of 4096; ``tokens``: T = 16,384 per micro-batch."""
    extra: dict[str, Any] = {"contract": "tokens", "max_tokens": MAX_TOKENS}
    return plan_scale.job(
        nodes, per_node, grad_accum=ACCUM, **(extra if contract == "tokens" else {})
    )


def measure(
    tokens_path: Path, costs_path: Path, contract: str, scope: str, nodes: int, per_node: int
) -> dict[str, Any]:
    """One process: map, set up, plan the first window and about :data:`STEADY_RECORDS`
    more records of its own row (row 0); timings per record and private RSS. Set-up is wall
    time (what a reader waits for); planning is the process's CPU time (``process_time``:
    what the planner costs, whatever else the machine runs); set-up is also given in CPU
    time (``setup_cpu_s``), which a loaded machine does not inflate."""
    base_rss = private_rss()
    t0, c0 = time.perf_counter(), time.process_time()
    costs = np.load(costs_path, mmap_mode="r")
    tokens = np.load(tokens_path, mmap_mode="r")
    n = int(costs.shape[0])
    counts = [SHARD] * (n // SHARD) + ([n % SHARD] if n % SHARD else [])
    table = ShardTable.build(counts, weight=shard_weights(counts, costs))
    config = plan_config(job(contract, nodes, per_node), scope)
    if contract == "tokens":  # what a reader builds: the geometry, evened (ReaderPlan)
        streams = build_token_streams(costs, table, config, seed=0, epoch=0, tokens=tokens)
    else:
        streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    setup_s = time.perf_counter() - t0
    setup_cpu_s = time.process_time() - c0
    row_ranks = streams.config.row_ranks
    geometry = streams.config if contract == "tokens" else config
    per_window = geometry.pack_size * geometry.window * row_ranks
    stop = min(streams.n_windows, 1 + -(-STEADY_RECORDS // per_window))
    planned: list[int] = []  # records planned (every rank of the row) per call
    times: list[float] = []
    peak = private_rss()
    if contract == "tokens":
        walker = TokenWalker(streams, costs, tokens, config)
        it = walker.walk([0], 0, stop)
        while True:
            t = time.process_time()
            step = next(it, None)
            if step is None:
                break
            times.append(time.process_time() - t)
            planned.append(int(np.count_nonzero(step.packs >= 0)))
            peak = max(peak, private_rss())
    else:  # the first window, then the rest in one call (``plan_scale``'s batches)
        carry = None
        for start, end in ((0, 1), (1, stop)):
            if end <= start:
                break
            t = time.process_time()
            batch = plan_windows(streams, costs, None, [0], start, end, carry)
            times.append(time.process_time() - t)
            carry = batch.carry
            planned.append(int(np.count_nonzero(batch.packs >= 0)))
            peak = max(peak, private_rss())
    steady_records = sum(planned[1:])
    steady_s = sum(times[1:])
    return {
        "contract": contract,
        "records": n,
        "nodes": nodes,
        "scope": scope,
        "ranks_per_node": per_node,
        "ranks_planned": row_ranks,
        "windows_planned": stop,
        "windows_per_epoch": streams.n_windows,
        "setup_s": setup_s,
        "setup_cpu_s": setup_cpu_s,
        "first_window_cpu_s": times[0] if times else float("nan"),
        "time_to_first_pack_s": setup_s + (times[0] if times else 0.0),
        "steady_cpu_s": steady_s,
        "records_planned": int(sum(planned)),
        "planning_us_per_record_planned": (
            1e6 * steady_s / steady_records if steady_records else float("nan")
        ),
        "planning_us_per_rank_record": (
            1e6 * steady_s * row_ranks / steady_records if steady_records else float("nan")
        ),
        "private_rss_growth_mb": (peak - base_rss) / 2**20,
    }


def main(argv: list[str]) -> int:
    """The child: ``TOKENS.npy COSTS.npy CONTRACT SCOPE NODES [RANKS_PER_NODE]`` -> one JSON
    row on stdout."""
    tokens_path, costs_path, contract, scope, nodes, *rest = argv
    per_node = int(rest[0]) if rest else PER_NODE
    row = measure(Path(tokens_path), Path(costs_path), contract, scope, int(nodes), per_node)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
