"""Shards to nodes: equal shard counts, equal excess cost, equal records (O(shards)).

Shards are dealt heaviest first, each row of ``n_nodes`` shards one per node, the heaviest to
the node with the least cost so far (:func:`balanced_deal`, randomized per (seed, epoch)). Node
totals match to within about one shard, record counts to within one shard, and a whole shard is
read by exactly one node per epoch. Streaming's ``orig``/``relaxed`` partitions give nodes
spans of a permuted shard list instead; with ordered data one node's span can then be mostly
one source (measured: 0.755 vs 0.861 world efficiency on a source-by-source mixture, 4 nodes).
Pieces of cut shards (``cuts.cut_shards``) go to distinct nodes.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.rng import Tag, epoch_rng
from bcl_stream.planner.shard_table import Ids, ShardTable

JITTER = 0.05
"""Relative noise on shard totals before dealing: varies the deal between epochs while keeping
node totals within a few percent of one shard."""


def excess_cost(table: ShardTable) -> npt.NDArray[np.float64]:
    """Each shard's cost beyond what its usable records would cost at the dataset's mean.

    Dealing on excess rather than on totals balances the mean cost per record of every bin
    even when entries hold different record counts (pieces of cut shards, a short last shard):
    a bin of equal records and equal totals but fewer records would run heavier per record.
    """
    totals = table.weight * table.usable
    records = table.usable.sum()
    rate = float(totals.sum()) / records if records else 0.0
    return totals - rate * table.usable


def balanced_deal(
    totals: npt.NDArray[np.float64],
    n_bins: int,
    rng: np.random.Generator,
    initial: npt.NDArray[np.float64] | None = None,
) -> Ids:
    """Bin of each item: equal item counts per bin (+-1) and near-equal sums of ``totals``
    (any signed score, e.g. :func:`excess_cost`).

    Items go heaviest first, in rows of ``n_bins``, the row's heaviest item to the lightest
    bin so far (LPT with one item per bin per row). A small relative jitter on the sort key and
    a random first row make the deal change from epoch to epoch without losing the balance.
    O(items log items).
    """
    n = totals.size
    jitter = 1.0 + JITTER * rng.standard_normal(n)
    by_total = np.lexsort((rng.random(n), -(totals * jitter)))
    load = rng.random(n_bins) * 1e-9 * max(float(np.abs(totals).max(initial=0.0)), 1.0)
    if initial is not None:
        load += initial
    count = np.zeros(n_bins, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    for row in range(0, n, n_bins):
        items = by_total[row : row + n_bins]
        lightest = np.lexsort((load, count))[: items.size]
        owner[items] = lightest
        load[lightest] += totals[items]
        count[lightest] += 1
    return owner


def deal_shards(
    table: ShardTable, n_nodes: int, seed: int, epoch: int, *, shuffle: bool = True
) -> list[Ids]:
    """Shard ids of each node, ``n_nodes`` arrays; each shard goes to exactly one node.

    Shuffled: :func:`balanced_deal` on the shards' cost totals (equal shard counts, node totals
    within about one shard), each node's shards in write order. Not shuffled: shard i goes to
    node i mod n_nodes, so at any time every node reads the same region of the write order
    (contiguous spans per node would give one node all the long records of sorted data).
    """
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be >= 1, got {n_nodes}")
    n_shards = table.counts.size
    if not shuffle:  # round robin: all nodes read neighbouring shards at the same time
        return [np.arange(n, n_shards, n_nodes, dtype=np.int64) for n in range(n_nodes)]
    rng = epoch_rng(seed, epoch, Tag.NODE_DEAL)
    totals = excess_cost(table)
    owner = np.full(n_shards, -1, dtype=np.int64)
    load = np.zeros(n_nodes)
    if table.split is not None:  # pieces first: whole shards then even out cost and records
        _deal_pieces(table, totals, n_nodes, rng, owner, load)
    whole = np.flatnonzero(owner < 0)
    follows = np.full(n_shards, -1, dtype=np.int64) if table.origin is None else table.origin
    # A repeated stream's copies of a shard go where its first copy goes (one download).
    copies = whole[follows[whole] >= 0]  # (cut_shards unlinks copies of cut shards)
    leaders = np.setdiff1d(whole, copies)
    records = table.usable.astype(np.int64)
    weight = totals.copy()
    np.add.at(records, follows[copies], records[copies])
    np.add.at(weight, follows[copies], weight[copies])
    records[copies], weight[copies] = 0, 0.0
    parts = table.stream_groups(leaders)  # a mixture's streams one by one: each on every node
    for part in parts:
        owner[part] = balanced_deal(weight[part], n_nodes, rng, load)
        np.add.at(load, owner[part], weight[part])
    owner[copies] = owner[follows[copies]]  # (records 0: the swaps count them on the leader)
    for part in parts:  # swaps inside a stream keep each node's share of it
        even_out_records(owner, part, records, weight, n_nodes)
    owner[copies] = owner[follows[copies]]
    return [np.flatnonzero(owner == n).astype(np.int64) for n in range(n_nodes)]


def even_out_records(
    owner: Ids,
    movable: Ids,
    records: Ids,
    excess: npt.NDArray[np.float64],
    n_bins: int,
    max_pairs: int = 1 << 18,
) -> None:
    """Swap shards between the bins with the most and the fewest records, in place.

    Every rank gets the pack count of the shortest node stream, so records a longer node holds
    beyond it are left for the epoch tail; shards differ in record count (MDS cuts shards by
    bytes), so equal shard counts do not give equal records. Each swap exchanges a pair of
    ``movable`` shards of about the same excess cost (within the mean |excess|) that narrows the
    record gap most; it stops when no swap narrows it. Bins of more than ``sqrt(max_pairs)``
    shards are left as dealt: there the gap is a small share of a node's records.
    """
    if n_bins < 2 or movable.size == 0:
        return
    if (movable.size / n_bins) ** 2 > max_pairs:
        return
    tol = float(np.abs(excess[movable]).mean())
    per_bin = np.bincount(owner, weights=records, minlength=n_bins)[:n_bins]
    for _ in range(movable.size):
        hi, lo = int(per_bin.argmax()), int(per_bin.argmin())
        gap = per_bin[hi] - per_bin[lo]
        a = movable[owner[movable] == hi]
        b = movable[owner[movable] == lo]
        if gap <= 0 or a.size * b.size == 0 or a.size * b.size > max_pairs:
            return
        moved = records[a][:, None] - records[b][None, :]
        drift = np.abs(excess[a][:, None] - excess[b][None, :])
        new_gap = np.where(drift <= tol, np.abs(gap - 2 * moved), np.inf)
        best = int(new_gap.argmin())
        if not new_gap.flat[best] < gap:
            return
        i, j = divmod(best, b.size)
        owner[a[i]], owner[b[j]] = lo, hi
        per_bin[hi] -= moved[i, j]
        per_bin[lo] += moved[i, j]


def _deal_pieces(
    table: ShardTable,
    totals: npt.NDArray[np.float64],
    n_nodes: int,
    rng: np.random.Generator,
    owner: Ids,
    load: npt.NDArray[np.float64],
) -> None:
    """Cut shards' pieces to distinct nodes, in place. A shard cut into one piece per node
    weighs on every node alike: its pieces go in a random order. A shard cut into fewer
    pieces (a team, ``cuts.cut_shards``) goes to the nodes with the fewest records so far, then
    the least excess cost, largest pieces first, so record counts (the pack count) stay even
    when every shard is cut."""
    assert table.split is not None
    cut = np.flatnonzero(table.split >= 0)
    shard_of = table.split[cut]
    bounds = np.flatnonzero(np.r_[True, shard_of[1:] != shard_of[:-1], True])
    groups = [cut[a:b] for a, b in itertools.pairwise(bounds)]
    weight = np.array([totals[g].sum() for g in groups])
    size = np.array([table.usable[g].max(initial=0) for g in groups])
    records = np.zeros(n_nodes)
    jitter = rng.random(n_nodes)  # random ties: which of equal nodes gets a piece first
    for i in np.lexsort((rng.random(len(groups)), -weight, -size)):
        pieces = groups[i]
        if pieces.size == n_nodes:
            owner[pieces] = rng.permutation(n_nodes)
        else:
            owner[pieces] = rng.permutation(np.lexsort((jitter, load, records))[: pieces.size])
        np.add.at(load, owner[pieces], totals[pieces])
        np.add.at(records, owner[pieces], table.usable[pieces])
