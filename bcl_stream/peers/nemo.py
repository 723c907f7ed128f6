"""NeMo-RL's sequence packing, reproduced exactly: the ``nemo_mffd`` peer.

Follows NVIDIA-NeMo/RL at revision 7ea279abfbeb698b092856d0dab61e7cf39bc909:
``ModifiedFirstFitDecreasingPacker`` and ``SequencePacker._adjust_bin_count`` in
``nemo_rl/data/packing/algorithms.py``, and the sequence-packing branch of
``BatchedDataDict.shard_by_batch_size`` in ``nemo_rl/distributed/batched_data_dict.py`` as the
policy calls it for training (``batch_size`` = the global batch, ``min_bin_count`` and
``bin_count_multiple`` = the data-parallel size, ``microbatch_order: packer`` as in the shipped
configs). Re-implemented from reading that code; the tie-breaking is NeMo-RL's.

What NeMo-RL does, and how it differs from a textbook MFFD (``mffd.py``):

1. Items are classed against the capacity C: large (> C/2), medium (C/3, C/2],
   small (C/6, C/3], tiny (<= C/6). Each large item opens a bin, largest first.
2. Forward over the large bins: add the largest medium item that fits.
3. Backward over the large bins that did *not* get a medium item: if the two smallest small
   items fit, add the smallest and then the largest small item that still fits. (The skip
   never changes a bin: a large plus a medium item leave less than C/6, and two small items
   need more than C/3; it is kept because it is NeMo-RL's.)
4. Forward over the large bins again: keep adding the largest remaining item that fits, so the
   existing bins are filled before any new bin opens.
5. What is left goes, largest first, into the *least-loaded* open bin if it fits there, else
   into a new bin (NeMo-RL's O(n log n) "FFD", in effect worst fit decreasing). These bins
   follow the large bins, in increasing load.
6. If the bin count is below R or not a multiple of R, new bins are opened holding one record
   each, taken (the last one added) from the bin with the most records until it has one left,
   then from the next; no bin is split in halves.

Bins are dealt round-robin (bin i of a global batch to rank i mod R), each rank runs its bins
in packer order. Record counts per micro-batch vary: NeMo-RL breaks the record-count contract
and needs a central pool of the whole global batch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from bcl_stream.peers.pools import Bins, Pool, Remainder

NEMO_RL_REVISION = "7ea279abfbeb698b092856d0dab61e7cf39bc909"


def mffd_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """NeMo-RL's ``ModifiedFirstFitDecreasingPacker._pack_implementation``: bins as lists of
    positions in ``lengths``, in NeMo-RL's bin order and in-bin order."""
    if capacity <= 0:
        raise ValueError(f"bin capacity must be positive, got {capacity}")
    sizes = [int(x) for x in lengths]
    for i, size in enumerate(sizes):
        if size <= 0 or size > capacity:
            raise ValueError(
                f"item {i}: length {size} is outside (0, {capacity}]; NeMo-RL packs only "
                "positive lengths up to the bin capacity"
            )
    # Integer forms of NeMo-RL's float thresholds C/2, C/3, C/6 (identical for int sizes).
    large = [i for i in range(len(sizes)) if 2 * sizes[i] > capacity]
    medium = [i for i in range(len(sizes)) if 3 * sizes[i] > capacity >= 2 * sizes[i]]
    small = [i for i in range(len(sizes)) if 6 * sizes[i] > capacity >= 3 * sizes[i]]
    tiny = [i for i in range(len(sizes)) if capacity >= 6 * sizes[i]]
    large.sort(key=lambda i: -sizes[i])  # stable sorts: equal sizes stay in index order
    medium.sort(key=lambda i: -sizes[i])
    small.sort(key=lambda i: sizes[i])

    bins = [[i] for i in large]
    load = [sizes[i] for i in large]

    # Phase 2: the largest medium item that fits (first fit in descending order).
    neg_medium = [-sizes[i] for i in medium]
    with_medium = [False] * len(bins)
    for b in range(len(bins)):
        k = bisect_left(neg_medium, load[b] - capacity)
        if k < len(medium):
            neg_medium.pop(k)
            item = medium.pop(k)
            bins[b].append(item)
            load[b] += sizes[item]
            with_medium[b] = True

    # Phase 3: backward, a pair of small items into bins without a medium item.
    small_sizes = [sizes[i] for i in small]
    for b in reversed(range(len(bins))):
        if with_medium[b] or len(small) < 2:
            continue
        if small_sizes[0] + small_sizes[1] > capacity - load[b]:
            continue
        first, first_size = small.pop(0), small_sizes.pop(0)
        k = bisect_right(small_sizes, capacity - load[b] - first_size) - 1  # >= 0: checked above
        second = small.pop(k)
        bins[b] += [first, second]
        load[b] += first_size + small_sizes.pop(k)

    # Phase 4: fill the large bins with the largest remaining item that fits. The rest is kept
    # ascending by (size, -index), so "largest that fits, lowest index on ties" is one bisect.
    rest = sorted(medium + small + tiny, key=lambda i: (sizes[i], -i))
    rest_sizes = [sizes[i] for i in rest]
    for b in range(len(bins)):
        while rest:
            k = bisect_right(rest_sizes, capacity - load[b]) - 1
            if k < 0:
                break
            rest_sizes.pop(k)
            item = rest.pop(k)
            bins[b].append(item)
            load[b] += sizes[item]

    # Phase 5: largest first, into the least-loaded open bin or a new one (loads ascending).
    open_bins: list[tuple[int, int, list[int]]] = []  # (load, insertion serial, items)
    for serial, item in enumerate(reversed(rest)):
        if open_bins and sizes[item] <= capacity - open_bins[0][0]:
            fill, _, members = open_bins.pop(0)
        else:
            fill, members = 0, []
        members.append(item)
        insort(open_bins, (fill + sizes[item], serial, members))  # after equal loads
    return bins + [members for _, _, members in open_bins]


def adjust_bin_count(bins: list[list[int]], multiple: int, minimum: int = 0) -> list[list[int]]:
    """NeMo-RL's ``SequencePacker._adjust_bin_count``: open bins of one record each until the
    count is >= ``minimum`` and a multiple of ``multiple``."""
    if multiple < 1 or minimum < 0:
        raise ValueError(f"multiple must be >= 1 and minimum >= 0, got {multiple}, {minimum}")
    target = max(len(bins), minimum)
    target += -target % multiple
    total = sum(len(b) for b in bins)
    if target == len(bins):
        return bins
    if total < target:
        raise ValueError(
            f"cannot make {target} bins of at least one record from {total} records; "
            "use a larger global batch or fewer ranks"
        )
    out = [list(b) for b in bins]
    donors = sorted(((len(b), i) for i, b in enumerate(bins)), reverse=True)
    d = 0
    for _ in range(target - len(bins)):
        while len(out[donors[d][1]]) < 2:  # NeMo-RL keeps taking from one bin until it has 1
            d += 1
        out.append([out[donors[d][1]].pop()])
    return out


def nemo_mffd(pool: Pool, capacity: int, *, pad_multiple: int = 1) -> tuple[Bins, Remainder]:
    """NeMo-RL's training shard of every global batch of R*B*G records of the pool's order.

    ``capacity`` is NeMo-RL's ``train_mb_tokens``; ``pad_multiple`` its
    ``make_sequence_length_divisible_by`` (lengths are padded up to it before packing).
    Output: ``[rank][micro-batch]`` arrays of record ids (every rank the same number of
    micro-batches, record counts varying), and ``{"epoch_tail": ids}`` for the last partial
    global batch.
    """
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
    tok, ranks = pool.tokens, pool.world_size

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        padded = -(-tok[members] // pad_multiple) * pad_multiple
        bad = np.flatnonzero((padded <= 0) | (padded > capacity))
        if bad.size:
            sid = int(members[bad[0]])
            raise ValueError(
                f"record {sid}: {int(tok[sid])} tokens (padded {int(padded[bad[0]])}) is outside "
                f"(0, {capacity}]; NeMo-RL refuses it: raise the capacity (train_mb_tokens) "
                "or drop empty and longer records"
            )
        bins = adjust_bin_count(mffd_bins(padded.tolist(), capacity), ranks, ranks)
        for b, positions in enumerate(bins):
            yield b % ranks, members[np.asarray(positions, dtype=np.int64)]

    return pool.deal(plan_batch)
