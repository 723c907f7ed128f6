"""Cut shards into pieces that several nodes read: lumps, and datasets too small per node.

A piece is a contiguous record range of a shard; every piece is a valid "shard" for the planner
(pieces lie in write order, so global record ids are unchanged), and the pieces of one shard go
to distinct nodes (``dealing.deal_shards``). A shard cut into q pieces is downloaded q times:
download amplification grows by (q - 1) / shards.

Two reasons to cut, one budget (:func:`read_budget`):

- **Lumps.** On length-sorted data with quadratic costs the last shard alone can hold 12% of
  the epoch's cost (a 1M-record Pareto corpus): a quarter of one node's share at 4 nodes, twice
  it at 16. No deal of whole shards evens that out. The heaviest shards are cut into one piece
  per node, heaviest first, while the budget lasts.
- **Little data per node.** When a node holds fewer than two shard groups, its stream is a few
  shards and cannot carry the dataset's mix (a source-by-source mixture of 1M records on 64
  nodes: about 4 shards per node). Every shard is then cut into ``team`` pieces read by
  ``team`` nodes, so each node reads a slice of ``team`` times as many shards: wider reads in
  exchange for amplification ``team``, within ``max_amplification``.

Where a node holds at least two shard groups, the budget is ``split_shards`` (5% extra
downloads: amplification <= 1.05) and only lumps are cut.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.shard_table import KeepFilter, ShardTable

MIN_SHARDS_PER_NODE = 2
"""Below this many shards per node, shards are cut so that every node gets records (whatever
the budget: without it some nodes would get none and the epoch would have no packs)."""

LUMP_FACTOR = 2.0
LUMP_SHARE = 0.1
"""A shard costing more than ``LUMP_FACTOR`` mean shards and ``LUMP_SHARE`` of one node's fair
share (total / nodes) is a lump: big enough to tilt a node. It is cut into one piece per node
(every node reads an equal slice of it, so it weighs on no node more than another). Measured
at 4 nodes x 8 on 1M-record corpora: 0.1 rather than 0.25 lifts a length-sorted Pareto corpus
from 0.809 to 0.862 world efficiency (1.05x downloads), at the price of 1.29x downloads and
0.9 points on a mixture whose long source sits at the length cap; cutting every shard over
twice the mean (no share test) cut more for no gain."""

TEAM_SHARDS = 32
"""Shards a node's stream should draw from: below it (and two shard groups), shards are cut
into ``team`` pieces until each node reads slices of about this many shards."""


def read_budget(
    n_shards: int, n_nodes: int, shard_group: int, split_shards: float, max_amplification: float
) -> tuple[float, bool]:
    """(extra downloads allowed per shard, whether wider reads are wanted) for ``n_shards`` on
    ``n_nodes``: locality where a node holds two shard groups or more, wider reads below."""
    if n_shards / n_nodes >= 2 * shard_group:
        return min(split_shards, max_amplification - 1.0), False
    return max_amplification - 1.0, True


def cut_shards(
    table: ShardTable,
    n_nodes: int,
    *,
    shard_group: int,
    split_shards: float,
    max_amplification: float,
    costs: npt.NDArray[np.floating] | None = None,
    keep: KeepFilter | None = None,
) -> ShardTable:
    """The table with shards cut into pieces read by distinct nodes (module docstring).

    Lumps first (heaviest first, each into one piece per node, while the budget lasts), then,
    where nodes hold little data, every shard into ``team`` pieces: the largest power of two the rest of the budget pays for, until each
    node reads slices of ``TEAM_SHARDS`` shards. Whatever the budget, a dataset of fewer than
    two shards per node has every shard cut into one piece per node, and so does a mixture's
    stream with fewer than two shards per node (it must reach every node).

    Output: a table whose cut entries carry ``split`` = the shard they are pieces of (pieces of
    one shard consecutive, 2..n_nodes of them, equal record ranges); piece weights recomputed
    from ``costs`` over the records ``keep`` keeps.
    """
    n = table.counts.size
    if n_nodes < 2 or n == 0:
        return table
    budget, wide = read_budget(n, n_nodes, shard_group, split_shards, max_amplification)
    counts = table.counts
    most = np.minimum(counts, n_nodes)  # a piece holds one record at least
    pieces = np.ones(n, dtype=np.int64)
    if n < MIN_SHARDS_PER_NODE * n_nodes:  # too few shards to deal: every node reads a piece
        pieces = most.copy()
    if table.stream is not None:  # a mixture's small stream: every node needs some of it
        for part in table.stream_groups(np.arange(n)):
            if part.size < MIN_SHARDS_PER_NODE * n_nodes:
                pieces[part] = most[part]
    extra = int(budget * n) - int((pieces - 1).sum())
    totals = table.weight * table.usable
    lump = max(LUMP_FACTOR * float(totals.mean()), LUMP_SHARE * float(totals.sum()) / n_nodes)
    for shard in np.argsort(-totals, kind="stable"):
        if totals[shard] <= lump:
            break  # heaviest first: no lighter shard is a lump either
        if most[shard] < n_nodes or pieces[shard] == n_nodes:
            continue
        if n_nodes - pieces[shard] > extra:
            break
        extra -= int(n_nodes - pieces[shard])
        pieces[shard] = n_nodes
    if wide:
        team = 1
        while team * 2 <= n_nodes and n / n_nodes * team < TEAM_SHARDS:
            grown = np.maximum(pieces, np.minimum(team * 2, most))
            if int((grown - pieces).sum()) > extra:
                break
            team *= 2
        grown = np.maximum(pieces, np.minimum(team, most))
        extra -= int((grown - pieces).sum())
        pieces = grown
    if not (pieces > 1).any():
        return table
    return _apply_cuts(table, pieces, costs, keep)


def _apply_cuts(
    table: ShardTable,
    pieces: npt.NDArray[np.int64],
    costs: npt.NDArray[np.floating] | None,
    keep: KeepFilter | None,
) -> ShardTable:
    """The table with shard i cut into ``pieces[i]`` equal record ranges (1: whole)."""
    n = table.counts.size
    starts = table.starts
    counts: list[int] = []
    usable: list[int] = []
    weight: list[float] = []
    split: list[int] = []
    label: list[int] = []
    labels = np.zeros(n, np.int64) if table.stream is None else table.stream
    new_index = np.full(n, -1, dtype=np.int64)  # entry of each whole shard in the new table
    for shard in range(n):
        q = int(pieces[shard])
        if q < 2:
            new_index[shard] = len(counts)
            counts.append(int(table.counts[shard]))
            usable.append(int(table.usable[shard]))
            weight.append(float(table.weight[shard]))
            split.append(-1)
            label.append(int(labels[shard]))
            continue
        cuts = np.linspace(0, int(table.counts[shard]), q + 1).astype(np.int64)
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
