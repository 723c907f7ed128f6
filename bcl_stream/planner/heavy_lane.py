"""The heavy lane: the rare records that decide step time at scale get a longer horizon.

At 64 nodes x 8 ranks a step holds 4096 records of B=8 per pack; the few records costing
several average packs land in most steps, and a window of W packs cannot line them up across
512 ranks: every window of every rank holds one record of the top cost stratum, so every step
of the world is as slow as the heaviest of 512 such records. Measured (heavy-tailed code corpus
in path order, 1M records): W=64 instead of 16 lifts world efficiency at 64 nodes from 0.70 to
0.84, so the horizon is the lever, but a long window for every record costs buffer and shuffle
quality.

So only the heaviest records get the long horizon. A node's stream is cut into **lane blocks**
of ``lane`` windows (``lane * W * P * B`` records, aligned at the same pack index on every
node). In each block, the ``W * P`` costliest records (one per pack of one window) move to the
block's first window, one per pack, heaviest first and dealt round robin over the P ranks; the
other records keep their stream order in the remaining positions. So:

- every node's heavy window is at the same steps (blocks are aligned to the epoch's pack
  index), and inside it step t of every node holds that node's t-th slice of its block's
  heaviest records: the world's heavy records are lined up by cost quantile, one per pack, with
  no record moving between nodes and no communication (WLB-LLM holds outliers in a central
  queue until there is one per micro-batch; this reaches the same "one per pack" from the
  replicated index alone);
- the other windows hold no record above the block's top quantile, so W-window LPT balances
  them well;
- a record moves at most ``lane - 1`` windows earlier than its stream position, never out of
  its block, so it stays in the shard cache of its shard group; nothing is dropped, every
  window still holds exactly W*P*B records, and exact B per pack is untouched.

A block costs one gather of ``lane * W * P * B`` records of the node's own stream and one
lexsort of their costs (O(block), cached per node), so a process pays for its own node only.
The last, partial block of an epoch is moved proportionally (``W * P * windows / lane``
records). ``lane`` <= 1 turns the lane off.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.shard_table import Ids

RARITY_RANK = 2
RARITY = 1.5
"""A lane record costs more than this many times the block's record at ``lane`` times its
rank (``rare``)."""

CACHE_BLOCKS = 2
"""Lane blocks kept per node: a window straddles at most two blocks."""


class Stream(Protocol):
    """What the lane needs of a node stream (``node_streams.NodeStream``)."""

    def take(self, positions: Ids) -> Ids: ...

    def labels(self, ids: Ids) -> Ids | None: ...


class HeavyLane:
    """Node-stream positions -> record ids, with each lane block's heaviest records moved to the
    block's first window (module docstring). One per epoch; identical in every process."""

    def __init__(
        self,
        nodes: Sequence[Stream],
        *,
        window: int,
        pack_size: int,
        ranks_per_node: int,
        lane: int,
        n_packs: int,
        costs: npt.NDArray[np.floating] | None,
        threshold: float = 0.0,
    ) -> None:
        self._nodes = nodes
        self._costs = costs
        self._threshold = threshold
        """Only records costing more than this enter the lane (the same on every node)."""
        self._window, self._size, self._ranks = window, pack_size, ranks_per_node
        self._node_window = window * pack_size * ranks_per_node
        """Node-stream records of one window of the node (every rank's W packs)."""
        self._windows = n_packs // window
        """Complete windows of the epoch: the lane moves records only inside them."""
        self.lane = lane if lane > 1 and costs is not None and self._windows > 0 else 0
        """Windows per lane block (0: off)."""
        self._cache: OrderedDict[tuple[int, int], Ids] = OrderedDict()

    def block_span(self, b: int) -> tuple[int, int]:
        """Node-stream positions [start, stop) of lane block ``b``."""
        lo = b * self.lane
        hi = min(lo + self.lane, self._windows)
        return lo * self._node_window, hi * self._node_window

    def take(self, node: int, positions: Ids) -> Ids:
        """Record ids of ``node`` at node-stream ``positions`` (any shape), lane applied."""
        stream = self._nodes[node]
        pos = np.asarray(positions, dtype=np.int64)
        if not self.lane:
            return stream.take(pos)
        out = np.empty(pos.shape, dtype=np.int64)
        flat, res = pos.reshape(-1), out.reshape(-1)
        span = self.lane * self._node_window
        block = flat // span
        outside = flat >= self._windows * self._node_window
        if outside.any():
            res[outside] = stream.take(flat[outside])
        for b in np.unique(block[~outside]):
            sel = (block == b) & ~outside
            res[sel] = self.block(node, int(b))[flat[sel] - int(b) * span]
        return out

    def block(self, node: int, b: int) -> Ids:
        """Lane block ``b`` of ``node`` in lane order: its heaviest records first, one per pack
        of the block's first window(s), the rest in stream order."""
        key = (node, b)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        lo, hi = self.block_span(b)
        ids = self._nodes[node].take(np.arange(lo, hi, dtype=np.int64))
        out = lane_order(
            ids,
            np.asarray(self._costs[ids], dtype=np.float64),  # type: ignore[index]
            self._nodes[node].labels(ids),
            threshold=self._threshold,
            window=self._window,
            pack_size=self._size,
            ranks_per_node=self._ranks,
            lane=self.lane,
        )
        self._cache[key] = out
        while len(self._cache) > CACHE_BLOCKS * max(len(self._nodes), 1):
            self._cache.popitem(last=False)
        return out


@functools.lru_cache(maxsize=8)
def slot_order(size: int, window: int, pack_size: int, ranks_per_node: int) -> Ids:
    """Block positions in the order lane records fill them: window by window, and inside a
    window round robin over the P ranks' slices (a rank's share of a node window is the r-th
    run of W*B records), so consecutive lane records go to different ranks and the first W*P
    of them to W packs of every rank. Cached: every block of an epoch has the same shape."""
    pos = np.arange(size, dtype=np.int64)
    rank_window = window * pack_size  # W*B records: one rank's slice of a node window
    node_window = rank_window * ranks_per_node
    inside = pos % node_window
    order = pos[np.lexsort((inside // rank_window, inside % rank_window, pos // node_window))]
    order.setflags(write=False)
    return order


def rare(costs: npt.NDArray[np.float64], count: int, threshold: float) -> int:
    """How many of the ``count`` costliest records are rare outliers worth the lane: those
    costing more than ``threshold`` and more than ``RARITY`` times the record at rank
    ``RARITY_RANK * count`` of the block. A class common enough to reach that rank too (a
    tenth of a mixture at the length cap) stays out: moving part of it into one window would
    put two of it in many packs there."""
    n = costs.size
    if count == 0 or n == 0:
        return 0
    top = np.partition(costs, n - count)[n - count :]  # the count costliest, in any order
    at = max(n - RARITY_RANK * count, 0)
    level = np.partition(costs, at)[at]
    bar = max(threshold, RARITY * float(level))
    return int(np.count_nonzero(top > bar))


def heaviest(ids: Ids, costs: npt.NDArray[np.float64], count: int) -> Ids:
    """Positions of the ``count`` costliest of ``ids``, heaviest first, ties by id (the same
    on every machine): a partition to the candidates, then an exact sort of those only."""
    if count >= ids.size:
        return np.lexsort((ids, -costs))
    bar = np.partition(costs, ids.size - count)[ids.size - count]
    candidates = np.flatnonzero(costs >= bar)
    return candidates[np.lexsort((ids[candidates], -costs[candidates]))][:count]


def lane_order(
    ids: Ids,
    costs: npt.NDArray[np.float64],
    labels: Ids | None = None,
    *,
    threshold: float = 0.0,
    window: int,
    pack_size: int,
    ranks_per_node: int,
    lane: int,
) -> Ids:
    """One block's records in lane order (a permutation of ``ids``).

    The block holds ``windows`` whole node windows; its ``W * P * windows / lane`` costliest
    records (ties by id: the same on every machine) take the first lane slots
    (:func:`slot_order`) heaviest first, and the others keep their order in the remaining
    positions. With ``labels`` (a mixture's stream of each record) every stream keeps the
    positions it had, so every window and every rank's slice keeps its exact stream counts:
    each stream gives the lane its share of the count (largest remainders), its own costliest
    records, placed in its own first positions in slot order.
    """
    windows = ids.size // (window * pack_size * ranks_per_node)
    count = window * ranks_per_node * windows // lane
    if count == 0:
        return ids
    order = slot_order(ids.size, window, pack_size, ranks_per_node)
    out = ids.copy()
    if labels is None:
        count = rare(costs, count, threshold)
        if count:
            _move(out, ids, costs, np.arange(ids.size), order[:count], count)
        return out
    lab = np.asarray(labels, np.int64)
    streams, sizes = np.unique(lab, return_counts=True)
    share = sizes * count / ids.size
    quota = np.floor(share).astype(np.int64)
    quota[np.argsort(quota - share, kind="stable")[: count - int(quota.sum())]] += 1
    for s, q in zip(streams.tolist(), quota.tolist(), strict=True):
        mine = np.flatnonzero(lab == s)  # the stream's positions, in order
        q = rare(costs[mine], q, threshold)
        if q:
            _move(out, ids, costs, mine, order[lab[order] == s][:q], q)
    return out


def _move(
    out: Ids, ids: Ids, costs: npt.NDArray[np.float64], mine: Ids, slots: Ids, count: int
) -> None:
    """Within positions ``mine``: the ``count`` costliest records to ``slots`` heaviest first,
    the others in their order to the rest of ``mine`` (in place on ``out``)."""
    heavy = mine[heaviest(ids[mine], costs[mine], count)]
    out[slots] = ids[heavy]
    free = np.zeros(ids.size, dtype=bool)
    free[mine] = True
    rest = free.copy()
    free[slots] = False  # the slots lie among ``mine``
    rest[heavy] = False
    out[free] = ids[rest]
