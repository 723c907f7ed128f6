"""The one helper the planner tests use to cut a cost array into shards as a writer would."""

from __future__ import annotations

import numpy as np

from bcl_stream.planner import ShardTable, shard_weights


def table_for(costs: np.ndarray, shard: int = 64) -> ShardTable:
    """Shards of ``shard`` records in write order (the last one shorter), weighted by cost."""
    n = costs.size
    counts = [shard] * (n // shard) + ([n % shard] if n % shard else [])
    return ShardTable.build(counts, weight=shard_weights(counts, costs))
