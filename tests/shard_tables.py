"""What the planner and simulator tests plan: record lengths, and a cost array cut into shards
as a writer would cut it."""

from __future__ import annotations

import numpy as np

from bcl_stream.planner import ShardTable, shard_weights


def lognormal_lengths(n: int, seed: int = 0, sigma: float = 1.0) -> np.ndarray:
    """Token counts of ``n`` records, lognormal (median ~400, a long tail), capped at 8192."""
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(6.0, sigma, n).astype(np.int64) + 1, 8192)


def table_for(costs: np.ndarray, shard: int = 64) -> ShardTable:
    """Shards of ``shard`` records in write order (the last one shorter), weighted by cost."""
    n = costs.size
    counts = [shard] * (n // shard) + ([n % shard] if n % shard else [])
    return ShardTable.build(counts, weight=shard_weights(counts, costs))
