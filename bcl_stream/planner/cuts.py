"""Cut shards into pieces that several nodes read: lumps, and datasets too small per node.

A piece is a contiguous record range of a shard; every piece is a valid "shard" for the
planner (pieces lie in write order, so global sample ids are unchanged), and the pieces of one
shard go to distinct nodes. Each extra piece costs one extra shard download.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.shard_table import KeepFilter, ShardTable

MIN_SHARDS_PER_NODE = 2
"""Below this many shards per node, shards are cut so that every node gets records."""


def split_heavy_shards(
    table: ShardTable,
    n_nodes: int,
    budget: float,
    costs: npt.NDArray[np.floating] | None = None,
    keep: KeepFilter | None = None,
) -> ShardTable:
    """The table with the heaviest shards cut into pieces that different nodes read.

    Whole shards are lumps: on length-sorted data with quadratic costs the last shard alone can
    hold a quarter of one node's fair share, and no deal of whole shards evens that out. Cutting
    a shard into q pieces (contiguous record ranges, q <= n_nodes) lets q nodes read it, which
    costs q - 1 extra shard downloads. Shards heavier than twice the mean are cut heaviest
    first into ``n_nodes`` equal pieces, one per node (so record counts per node stay equal),
    while the extra downloads stay within ``budget`` times the shard count (download
    amplification <= 1 + budget); with many nodes the budget may allow none. Piece weights are recomputed from
    ``costs`` over the records ``keep`` keeps. Every piece is a valid "shard" for the planner:
    pieces lie in write order, so global sample ids are unchanged.
    """
    n = table.counts.size
    totals = table.weight * table.usable
    if n_nodes < 2 or n == 0:
        return table
    if n < MIN_SHARDS_PER_NODE * n_nodes:  # too few shards to deal: every node reads a piece
        heavy = np.flatnonzero(table.counts >= n_nodes)
    else:
        n_cut = int(budget * n) // (n_nodes - 1)
        mean = float(totals.sum()) / n
        heavy = np.argsort(-totals, kind="stable")[:n_cut]
        heavy = heavy[(totals[heavy] > 2.0 * mean) & (table.counts[heavy] >= n_nodes)]
    if table.stream is not None:  # a mixture's small stream: every node needs some of it
        for part in table.stream_groups(np.arange(n)):
            if part.size < MIN_SHARDS_PER_NODE * n_nodes:
                heavy = np.union1d(heavy, part[table.counts[part] >= n_nodes])
    if heavy.size == 0:
        return table
    is_cut = np.zeros(n, dtype=bool)
    is_cut[heavy] = True
    starts = table.starts
    counts: list[int] = []
    usable: list[int] = []
    weight: list[float] = []
    split: list[int] = []
    label: list[int] = []
    labels = np.zeros(n, np.int64) if table.stream is None else table.stream
    new_index = np.full(n, -1, dtype=np.int64)  # entry of each whole shard in the new table
    for shard in range(n):
        if not is_cut[shard]:
            new_index[shard] = len(counts)
            counts.append(int(table.counts[shard]))
            usable.append(int(table.usable[shard]))
            weight.append(float(table.weight[shard]))
            split.append(-1)
            label.append(int(labels[shard]))
            continue
        cuts = np.linspace(0, int(table.counts[shard]), n_nodes + 1).astype(np.int64)
        for lo, hi in itertools.pairwise(cuts):
            split.append(shard)
            label.append(int(labels[shard]))
            ids = np.arange(starts[shard] + lo, starts[shard] + hi, dtype=np.int64)
            if keep is not None and keep.active:
                ids = ids[keep(ids)]
            counts.append(int(hi - lo))
            usable.append(int(ids.size))
            piece_costs = None if costs is None else np.asarray(costs[ids], dtype=np.float64)
            if piece_costs is None or ids.size == 0:
                weight.append(float(table.weight[shard]))
            else:
                weight.append(float(piece_costs.mean()))
    origin = None
    if table.origin is not None:  # copies follow their first copy while both stay whole
        origin = np.full(len(counts), -1, dtype=np.int64)
        kept = np.flatnonzero(new_index >= 0)
        leader = table.origin[kept]
        ok = leader >= 0
        origin[new_index[kept[ok]]] = new_index[leader[ok]]
    return ShardTable.build(
        counts, usable, weight, split, None if table.stream is None else label, origin
    )
