"""What the planner and simulator tests plan: record lengths, and a cost array (or a cost index)
cut into shards as a writer would cut it."""

from __future__ import annotations

import numpy as np

from bcl_stream.cost import get_preset
from bcl_stream.io.index import CostIndex, ShardEntry
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


def lognormal_index(
    n: int, shard: int, seed: int, mu: float, cap: int, cost_model: str = "llama3-8b"
) -> CostIndex:
    """A cost index of ``n`` records, lognormal(``mu``, 1.1) tokens clipped to [1, ``cap``],
    in MDS shards ``s0, s1, ...`` of ``shard`` records (the last one shorter)."""
    rng = np.random.default_rng(seed)
    tokens = np.clip(rng.lognormal(mu, 1.1, n).astype(np.int64), 1, cap)
    shards = [ShardEntry(f"s{i}", min(shard, n - i * shard)) for i in range(-(-n // shard))]
    return CostIndex.build(tokens, get_preset(cost_model), shards, "mds")
