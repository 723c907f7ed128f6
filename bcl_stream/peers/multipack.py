"""The multipack sampler (axolotl's ancestor), reproduced: the ``multipack`` peer.

Follows imoneoi/multipack_sampler at revision a023ee17f1638d004a97f183ecdc1799bcb24848,
``multipack_sampler.py`` (``ffd_check``, ``ffd_with_result``, ``allocate``,
``MultipackDistributedBatchSampler.generate_batches``); axolotl's ``MultipackBatchSampler``
grew from it. Re-implemented from reading that code in numpy (upstream compiles the same loops
with numba; its ``np.argsort`` breaks ties among equal lengths as numba's quicksort does, which
may order equal-length records differently from numpy's here: the bins' token sums, what the
peer is measured on, are the same).

How it plans, on every rank alike with no communication: one permutation of the epoch's
records by the shared seed (here the simulator's shared global order, as for every pooled
peer); then, from the start of the order, the longest prefix whose records First-Fit-Decreasing
packs into R bins of capacity c (``batch_max_length``: the token budget T) by binary search,
packed into bins in FFD creation order, bin r to rank r; repeat from the next record until a
prefix needs fewer than R bins (the rest of the epoch is left out). Every rank runs the same
number of micro-batches (one per allocation), a micro-batch holds at most T tokens, and the
objective is linear: token counts, no quadratic attention term, so ranks' costs differ where
their bins hold records of different lengths. Gradient accumulation takes G consecutive
allocations as one step. Records per micro-batch vary: it breaks the record-count contract.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.peers.pools import Bins, Pool, Remainder
from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG

MULTIPACK_REVISION = "a023ee17f1638d004a97f183ecdc1799bcb24848"


def ffd_check(a: npt.NDArray[np.int64], c: int, n: int) -> bool:
    """Whether First Fit Decreasing packs ``a`` into ``n`` bins of capacity ``c``."""
    bins = np.full(n, c, dtype=np.int64)
    for size in np.sort(a)[::-1].tolist():
        room = np.flatnonzero(bins >= size)
        if room.size == 0:
            return False
        bins[room[0]] -= size
    return True


def ffd_with_result(a: npt.NDArray[np.int64], c: int, start_index: int) -> list[list[int]]:
    """FFD into as many bins as it takes: positions (plus ``start_index``) per bin, bins in
    the order FFD opened them."""
    indices = np.argsort(a)[::-1]
    bins: list[int] = []
    result: list[list[int]] = []
    for index, size in zip(indices.tolist(), a[indices].tolist(), strict=True):
        for b, room in enumerate(bins):
            if room >= size:
                bins[b] -= size
                result[b].append(index + start_index)
                break
        else:
            bins.append(c - size)
            result.append([index + start_index])
    return result


def allocate(lengths: npt.NDArray[np.int64], c: int, n: int) -> tuple[list[list[list[int]]], int]:
    """Every allocation's n bins (positions into ``lengths``) and the positions used: the
    upstream ``allocate`` for all ranks at once (upstream returns one rank's bins)."""
    cumsum = np.cumsum(lengths)
    s, start, out = 0, 0, []
    while True:
        lo = 1
        hi = 1 + int(np.searchsorted(cumsum[start:], s + c * n, "right"))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ffd_check(lengths[start : start + mid], c, n):
                lo = mid
            else:
                hi = mid
        batch = ffd_with_result(lengths[start : start + lo], c, start)
        if len(batch) < n:
            break
        start += lo
        s = int(cumsum[start - 1])
        out.append(batch)
    return out, start


def multipack(pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """The multipack sampler at ``batch_max_length`` = ``capacity`` over the pool's order.

    Output: ``[rank][micro-batch]`` record ids, every rank the same count; the remainder: the
    records after the last full allocation (``epoch_tail``), and records longer than the
    capacity (``longer_than_max_tokens``: upstream would pack such a record alone into a bin
    over capacity; here it is left out, as the other peers do, so no micro-batch passes T)."""
    order = pool.order
    tok = pool.tokens[order]
    long = tok > capacity
    kept = order[~long]
    allocations, used = allocate(pool.tokens[kept], capacity, pool.world_size)
    per_rank: Bins = [[] for _ in range(pool.world_size)]
    for batch in allocations:
        for r in range(pool.world_size):
            per_rank[r].append(kept[np.asarray(batch[r], dtype=np.int64)])
    remainder: Remainder = {REASON_TAIL: kept[used:]}
    if long.any():
        remainder[REASON_TOO_LONG] = order[long]
    return per_rank, remainder
