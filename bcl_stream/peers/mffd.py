"""A textbook Modified First Fit Decreasing packer: the ``pooled_mffd_split`` strategy.

No system ships this: NeMo-RL's own packer is ``nemo.py`` (``nemo_mffd``), which differs in four
steps and balances worse. It stays as a stronger central token packer than any peer ships, to
show how much a better packer would change the comparison. ``pooled_mffd_split`` pools a global
batch of R*B*G records, packs it by tokens into bins of capacity M (:func:`mffd`) and deals the
bins round-robin so every rank runs the same number of bins; when the bin count is not a
multiple of R, the fullest bins are split in two until it is. Record counts per bin vary (it
breaks the record-count contract) and it needs a central pool.

:func:`mffd` (Johnson & Garey, 1985) fills bins of capacity C tokens close to C, with a variable
number of records per bin. Items are classed by size relative to C: large (> C/2), medium
(C/3, C/2], small (C/6, C/3], tiny (<= C/6).

1. Each large item opens its own bin, in decreasing order.
2. Forward over those bins: if the smallest remaining medium item fits, add the largest
   medium item that fits.
3. Backward over those bins: if the two smallest remaining small items fit together, add the
   smallest, then the largest remaining small item that still fits.
4. Every remaining item, in decreasing order, goes to the first bin it fits (First Fit
   Decreasing), opening a new bin when none fits.

This is a baseline, not the hot path; it runs on one pooled global batch at a time.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from bcl_stream.peers.pools import Bins, Pool, Remainder


def mffd(sizes: npt.NDArray[np.integer], capacity: int) -> list[list[int]]:
    """Pack item indices into bins of ``capacity``. Output: bins as lists of positions in ``sizes``."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if sizes.size and int(sizes.max()) > capacity:
        raise ValueError(
            f"an item of {int(sizes.max())} tokens exceeds the bin capacity {capacity}"
        )
    order = np.argsort(-sizes, kind="stable")
    large = [int(i) for i in order if 2 * sizes[i] > capacity]
    medium = [int(i) for i in order if 3 * sizes[i] > capacity >= 2 * sizes[i]]
    small = [int(i) for i in order if 6 * sizes[i] > capacity >= 3 * sizes[i]]
    tiny = [int(i) for i in order if capacity >= 6 * sizes[i]]

    bins: list[list[int]] = [[i] for i in large]
    free = [capacity - int(sizes[i]) for i in large]

    # Step 2: medium items, forward. Keep them ascending by size for bisect.
    med = sorted(medium, key=lambda i: (int(sizes[i]), i))
    med_sizes = [int(sizes[i]) for i in med]
    for b in range(len(bins)):
        if not med or med_sizes[0] > free[b]:
            continue
        k = bisect.bisect_right(med_sizes, free[b]) - 1  # largest that fits
        bins[b].append(med.pop(k))
        free[b] -= med_sizes.pop(k)

    # Step 3: small items, backward.
    sm = sorted(small, key=lambda i: (int(sizes[i]), i))
    sm_sizes = [int(sizes[i]) for i in sm]
    for b in reversed(range(len(bins))):
        if len(sm) < 2 or sm_sizes[0] + sm_sizes[1] > free[b]:
            continue
        bins[b].append(sm.pop(0))
        free[b] -= sm_sizes.pop(0)
        k = bisect.bisect_right(sm_sizes, free[b]) - 1
        if k >= 0:
            bins[b].append(sm.pop(k))
            free[b] -= sm_sizes.pop(k)

    # Step 4: First Fit Decreasing for everything left.
    rest = sorted(med + sm + tiny, key=lambda i: (-int(sizes[i]), i))
    for i in rest:
        size = int(sizes[i])
        for b in range(len(bins)):
            if free[b] >= size:
                bins[b].append(i)
                free[b] -= size
                break
        else:
            bins.append([i])
            free.append(capacity - size)
    return bins


def _split_to_multiple(bins: list[list[int]], sizes: npt.NDArray[np.int64], multiple: int) -> None:
    while len(bins) % multiple:
        loads = [int(sizes[b].sum()) if len(b) > 1 else -1 for b in bins]
        fullest = int(np.argmax(loads))
        if loads[fullest] < 0:  # only single-record bins: nothing left to split
            break
        items = sorted(bins[fullest], key=lambda i: -int(sizes[i]))
        bins[fullest], extra = items[0::2], items[1::2]
        bins.append(extra)


def pooled_mffd_split(pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """Bins per rank (each a variable-length array of record ids) and the remainder by reason.

    Global batches of R*B*G records are packed one at a time, in stream order; a last partial
    global batch is left out (``epoch_tail``) as a trainer would.
    """

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        sizes = pool.tokens[members]
        bins = mffd(sizes, capacity)
        _split_to_multiple(bins, sizes, pool.world_size)
        for b, positions in enumerate(bins):
            yield b % pool.world_size, members[np.asarray(positions, dtype=np.int64)]

    return pool.deal(plan_batch)
