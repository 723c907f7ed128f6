"""Modified First Fit Decreasing bin packing (Johnson & Garey, 1985), by token count.

The baseline that pooled packers (NeMo-RL style) use: bins of capacity C tokens, filled close
to C, with a variable number of records per bin. Items are classed by size relative to C:
large (> C/2), medium (C/3, C/2], small (C/6, C/3], tiny (<= C/6).

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

import numpy as np
import numpy.typing as npt


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
