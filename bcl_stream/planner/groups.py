"""A node's shards in shard groups: the unit of the shuffle and of the shard cache.

A node's shards are dealt into groups of ``group`` shards the same balanced way as shards to
nodes, groups in an order shared by every node. A group's records are shuffled together
(stratified by cost, ``stratify.stratified_permutation``). ``group`` is the trade-off between
shuffle quality and cache: a window mixes records of ``group`` shards drawn across the dataset,
and a node needs at most the shards of the two groups a window straddles resident at once.
Streaming's ``py1e`` makes the same trade with a sliding block of records; a stratified group
gets the mixture's proportions into every window with fewer shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.dealing import balanced_deal, excess_cost
from bcl_stream.planner.rng import Tag, epoch_rng
from bcl_stream.planner.shard_table import Ids, KeepFilter, ShardTable

CUT_FACTOR = 3.0
"""A shard whose excess cost is this many times the node's mean |excess| is a lump: cut into
one piece per shard group rather than dealt whole (:func:`shard_groups`)."""
DEFAULT_SHARD_GROUP = 64
"""Shards shuffled together in a node. With 4096-record shards a group is 262K records (Mosaic
Streaming's default ``py1e`` block is 1<<18 records too); a node holds at most two groups. On
the ordered corpora of tools/bench_balance.py (4 nodes x 8) groups of 8 shards lose 4-19 points
of world efficiency against 64, groups of 32 up to 3 points."""


@dataclass(frozen=True, slots=True)
class NodeGroups:
    """A node's shard groups as record ranges: group g reads ``ranges[g]`` ((start, count) of
    global record ids), ``usable[g]`` records of them after the filter."""

    ranges: list[list[tuple[int, int]]]
    usable: Ids
    shards: Ids
    """Every shard the node reads (each once)."""
    slices: list[list[tuple[int, int]]] | None = None
    """A mixture's groups (:func:`_stream_slices`): for each range, (skip, take) of its records
    the filter keeps; None: every kept record of every range."""


def shard_groups(
    table: ShardTable,
    node_shards: Ids,
    group: int,
    rng: np.random.Generator | None,
    shared: tuple[int, int] = (0, 0),
    keep: KeepFilter | None = None,
) -> NodeGroups:
    """The node's shards cut into groups of about ``group`` shards.

    With ``rng``: shards are dealt by :func:`balanced_deal` on their :func:`excess_cost`, so
    every group carries about the node's mean cost per record. A shard whose excess is a lump
    no deal can even out (more than ``CUT_FACTOR`` times the mean, typically the last shards of
    length-sorted data) is cut into one piece per group instead (at most ``group // 4`` such
    shards, so the node's shard cache grows by at most a quarter: a cut shard stays resident
    while its pieces are read; nothing is downloaded twice). Groups are then ranked by excess
    and placed in an order drawn from ``shared`` = (seed, epoch) only, the same on every node
    with as many groups, so the nodes' heavier groups run at the same time (what world balance
    needs) while the order still changes every epoch. Without ``rng``: consecutive runs of
    shards in the given order.
    """
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    shards = np.asarray(node_shards, dtype=np.int64)
    starts, counts, usable = table.starts, table.counts, table.usable
    n_groups = -(-shards.size // group)
    if rng is None or n_groups <= 1:
        runs = [shards[i : i + group] for i in range(0, shards.size, group)]
        return NodeGroups(
            [[(int(starts[x]), int(counts[x])) for x in run] for run in runs],
            np.array([int(usable[run].sum()) for run in runs], dtype=np.int64),
            shards,
        )
    if table.stream is not None:
        return _stream_slices(table, shards, n_groups, rng, shared)
    excess = excess_cost(table)[shards]
    cut = _lumps(table, shards, excess, n_groups, max(1, group // 4))
    whole = np.setdiff1d(np.arange(shards.size), cut)
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(n_groups)]
    kept = np.zeros(n_groups, dtype=np.int64)
    load = np.zeros(n_groups)
    for i in cut:  # one piece per group, pieces in a random rotation
        shard = int(shards[i])
        edges = np.linspace(0, int(counts[shard]), n_groups + 1).astype(np.int64)
        for g, piece in zip(rng.permutation(n_groups), range(n_groups), strict=True):
            lo, hi = int(starts[shard] + edges[piece]), int(starts[shard] + edges[piece + 1])
            ranges[g].append((lo, hi - lo))
            ids = np.arange(lo, hi, dtype=np.int64)
            kept[g] += int(keep(ids).sum()) if keep is not None and keep.active else hi - lo
            load[g] += excess[i] * (hi - lo) / max(int(counts[shard]), 1)
    owner = balanced_deal(excess[whole], n_groups, rng, load)
    for i, g in zip(whole, owner, strict=True):
        shard = int(shards[i])
        ranges[g].append((int(starts[shard]), int(counts[shard])))
        kept[g] += int(usable[shard])
        load[g] += excess[i]
    by_excess = np.argsort(-load, kind="stable")
    slot = epoch_rng(*shared, Tag.GROUP_ORDER, n_groups).permutation(n_groups)
    order = [int(by_excess[r]) for r in slot]
    return NodeGroups([ranges[g] for g in order], kept[order], shards)


def _lumps(
    table: ShardTable, shards: Ids, excess: npt.NDArray[np.float64], n_groups: int, most: int
) -> Ids:
    """The node's lumps, largest first, as positions in ``shards``: shards whose |excess|
    exceeds ``CUT_FACTOR`` times the node's mean (the ``most`` largest at most), with a record
    per group to cut into."""
    lump = CUT_FACTOR * float(np.abs(excess).mean())
    by_size = np.argsort(-np.abs(excess), kind="stable")[:most]
    return by_size[(np.abs(excess[by_size]) > lump) & (table.counts[shards[by_size]] >= n_groups)]


def _stream_slices(
    table: ShardTable,
    shards: Ids,
    n_groups: int,
    rng: np.random.Generator,
    shared: tuple[int, int],
) -> NodeGroups:
    """A mixture node's groups: each holds an equal slice of every stream's usable records.

    Each stream's shards are dealt into ``n_groups`` bins by :func:`balanced_deal` (the load
    carried from stream to stream, so bin totals stay even), bins are placed in the shared
    order as in :func:`shard_groups`, and then each stream's shards, bin after bin in that
    read order, are cut into ``n_groups`` consecutive slices of equal usable record counts
    (+-1): group r reads slice r of every stream. So every group holds the mixture's
    proportions exactly, however few shards a small stream has, and each stream is read in one
    pass, a shard at most straddling two consecutive groups (one more resident shard per
    stream, never a second download).
    """
    excess = excess_cost(table)
    owner: dict[int, Ids] = {}
    load = np.zeros(n_groups)
    lumps = shards[_lumps(table, shards, excess[shards], n_groups, max(1, n_groups // 4))]
    parts = table.stream_groups(np.setdiff1d(shards, lumps))
    for i, part in enumerate(parts):
        owner[i] = balanced_deal(excess[part], n_groups, rng, load)
        np.add.at(load, owner[i], excess[part])
    by_excess = np.argsort(-load, kind="stable")
    slot = epoch_rng(*shared, Tag.GROUP_ORDER, n_groups).permutation(n_groups)
    read_position = np.empty(n_groups, dtype=np.int64)
    read_position[by_excess[slot]] = np.arange(n_groups)
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(n_groups)]
    slices: list[list[tuple[int, int]]] = [[] for _ in range(n_groups)]
    kept = np.zeros(n_groups, dtype=np.int64)
    starts = table.starts
    for shard in lumps.tolist():  # a lump: an equal slice in every group
        bounds = np.arange(n_groups + 1, dtype=np.int64) * int(table.usable[shard]) // n_groups
        for g in range(n_groups):
            ranges[g].append((int(starts[shard]), int(table.counts[shard])))
            slices[g].append((int(bounds[g]), int(bounds[g + 1] - bounds[g])))
            kept[g] += int(bounds[g + 1] - bounds[g])
    for i, part in enumerate(parts):
        sequence = part[np.lexsort((np.arange(part.size), read_position[owner[i]]))]
        usable = table.usable[sequence]
        ends = np.cumsum(usable)
        begins = ends - usable
        bounds = np.arange(n_groups + 1, dtype=np.int64) * int(ends[-1]) // n_groups
        for g in range(n_groups):
            a, b = int(bounds[g]), int(bounds[g + 1])
            kept[g] += b - a
            first = int(np.searchsorted(ends, a, side="right"))
            for j in range(first, sequence.size):
                if begins[j] >= b:
                    break
                lo, hi = max(a, int(begins[j])), min(b, int(ends[j]))
                if hi > lo:
                    shard = int(sequence[j])
                    ranges[g].append((int(starts[shard]), int(table.counts[shard])))
                    slices[g].append((lo - int(begins[j]), hi - lo))
    return NodeGroups(ranges, kept, shards, slices)
