"""Regrouping a window's micro-batches before the two-term swaps (``planner/two_term.py``).

Why: the swaps exchange records between the ranks of one micro-batch index, so they can never
change how many images a micro-batch index holds in all. Where images are near-uniform in
size (TACO's photos: 99.8% within 4,888-5,040 patches under Qwen2-VL's ``max_pixels``), a
micro-batch index whose ranks hold 11 images in all leaves one rank with 2 while the mean is
1.375, whatever the swaps do: the token-only plan's vision ceiling on TACO's text+image mix
is 0.91-0.94 (``tools/bench_vlm.py``). Every rank of a node computes the node's whole window,
so the node's packs of one window can be dealt again into micro-batch indices, each index
taking packs of like vision and language cost, without communication. A pack stays whole: no
record count, token budget or node changes; records move only between micro-batch indices of
one window (unit of planning, resume and refinement alike).

Three groupings of a window's P x W packs into W micro-batch indices of P packs:

- ``by_vision``: packs sorted by vision cost, then language cost, both descending, cut in
  runs of P. Where every pack is close to the budget (the token contract) their language costs
  are near-equal, and this alone lifts TACO's mix from 0.90 to 0.98 vision efficiency with the
  language term unchanged;
- ``boxes``: greedy boxes in the plane of (vision, language), each relative to its mean over
  the window: the largest remaining pack opens a micro-batch index, and the P - 1 packs that
  raise its (max vision + max language) least join it, ties to the largest. Under the record
  contract packs differ in language across the window and sorting by vision alone costs
  language balance; the boxes keep both;
- ``by_sum``: packs sorted by summed cost, descending: indices of like one-step cost, evened
  term by term by the swaps. Added on the same COCO and TACO rows (COCO's held-out 2B mix at
  B = 8: vision efficiency 0.958 -> 0.977; TACO's 7B mix at B = 8: 0.958 -> 0.972; no row of
  either corpus lost more than 0.001), before the third corpus (MathVista) was run.

Indices are ordered heaviest first (the planner's ``desc`` order). ``two_term.py`` refines the
plan as given and each grouping, and keeps, per node and window, the one with the lowest sum
of the three inverse efficiencies (vision, language, sum) among those that leave neither
term worse balanced than the plan given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Grouping = Callable[
    [npt.NDArray[np.float64], npt.NDArray[np.float64], int], npt.NDArray[np.int64] | None
]
"""(vision per pack, language per pack, P) -> the packs' order, P per micro-batch index, or
None where the window has nothing to regroup."""


def _relative(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64] | None:
    mean = float(values.mean()) if values.size else 0.0
    return None if mean <= 0 else values / mean


def by_vision(
    vision: npt.NDArray[np.float64], language: npt.NDArray[np.float64], p: int
) -> npt.NDArray[np.int64] | None:
    """Packs by vision cost, then language cost, descending (ties: the earlier pack)."""
    if _relative(vision) is None:
        return None
    return np.lexsort((np.arange(vision.size), -language, -vision)).astype(np.int64)


def by_sum(
    vision: npt.NDArray[np.float64], language: npt.NDArray[np.float64], p: int
) -> npt.NDArray[np.int64] | None:
    """Packs by summed cost, descending (ties: the earlier pack): indices of like one-step
    cost, whose vision and language the swaps then even out."""
    if _relative(vision) is None:
        return None
    return np.lexsort((np.arange(vision.size), -(vision + language))).astype(np.int64)


def boxes(
    vision: npt.NDArray[np.float64], language: npt.NDArray[np.float64], p: int
) -> npt.NDArray[np.int64] | None:
    """Greedy boxes in (vision, language), each relative to its window mean (module
    docstring); indices ordered by their (max vision + max language), heaviest first."""
    x, y = _relative(vision), _relative(language)
    if x is None or y is None:
        return None
    size = x + y
    left = np.ones(x.size, dtype=bool)
    groups: list[list[int]] = []
    tops: list[float] = []
    while left.any():
        free = np.flatnonzero(left)
        first = int(free[np.argmax(size[free])])  # ties: the earlier pack
        left[first] = False
        group, top_x, top_y = [first], x[first], y[first]
        for _ in range(p - 1):
            free = np.flatnonzero(left)
            rise = np.maximum(x[free] - top_x, 0.0) + np.maximum(y[free] - top_y, 0.0)
            pick = int(free[np.lexsort((free, -size[free], rise))[0]])
            left[pick] = False
            group.append(pick)
            top_x, top_y = max(top_x, x[pick]), max(top_y, y[pick])
        groups.append(group)
        tops.append(top_x + top_y)
    order = sorted(range(len(groups)), key=lambda g: (-tops[g], g))
    return np.asarray([i for g in order for i in groups[g]], dtype=np.int64)


GROUPINGS: tuple[Grouping, ...] = (by_vision, boxes, by_sum)

TOLERANCE = 1e-12
"""Relative slack when a refined window's sum of term maxima is compared with the plan's:
a regrouping sums the same maxima in another order."""


def window_figures(
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    unit: npt.NDArray[np.int64],
    n_units: int,
) -> npt.NDArray[np.float64]:
    """(windows, 6) from per-slot costs (micro-batches, ranks, width) and each micro-batch's
    window ``unit``: each window's sum over its micro-batches of max_r V, max_r L and
    max_r (V + L) (the denominators of its vision, language and summed efficiency), then of
    mean_r V, mean_r L and mean_r (V + L) (their numerators, which no regrouping or swap
    changes)."""
    vs, ls = v.sum(axis=2), lang.sum(axis=2)
    out = np.zeros((n_units, 6))
    for col, sums in enumerate((vs, ls, vs + ls)):
        out[:, col] = np.bincount(unit, weights=sums.max(axis=1), minlength=n_units)
        out[:, 3 + col] = np.bincount(unit, weights=sums.mean(axis=1), minlength=n_units)
    return out


def scores(
    figures: npt.NDArray[np.float64], weights: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Each window's score under ``weights`` (windows, 3): its three sums of maxima, each
    divided by its guard unit's sum of means (``weights`` = 1 / those; 0 for a term the unit
    lacks). Summed over a unit it is the unit's vision, language and summed inverse
    efficiencies: the windows of a unit add up as the efficiency over the epoch does, a
    window weighing by its cost, not alike."""
    return (figures[..., :3] * weights).sum(axis=-1)


def not_worse(
    figures: npt.NDArray[np.float64], before: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Per window (any leading axes): neither term's sum of maxima above ``before``'s."""
    return (figures[..., :2] <= before[..., :2] * (1 + TOLERANCE)).all(axis=-1)


def per_guard(
    values: npt.NDArray[np.float64], guards: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """(windows, k) values summed per guard unit ``guards[window]``: (units, k)."""
    n = int(guards.max()) + 1 if guards.size else 0
    return np.stack(
        [np.bincount(guards, weights=values[:, j], minlength=n) for j in range(values.shape[1])],
        axis=1,
    )


def regrouped(
    rows: npt.NDArray[np.int64],
    pack_vision: npt.NDArray[np.float64],
    pack_language: npt.NDArray[np.float64],
    bounds: list[tuple[int, int]],
    grouping: Grouping,
) -> npt.NDArray[np.int64]:
    """``rows`` (micro-batches, ranks, width) with each unit's packs (rows ``lo:hi`` of
    ``bounds``) dealt again by ``grouping``; a unit the grouping leaves alone is copied."""
    out = rows.copy()
    p = rows.shape[1]
    for lo, hi in bounds:
        order = grouping(pack_vision[lo:hi].ravel(), pack_language[lo:hi].ravel(), p)
        if order is None:
            continue
        flat = rows[lo:hi].reshape((hi - lo) * p, rows.shape[2])
        out[lo:hi] = flat[order].reshape(hi - lo, p, rows.shape[2])
    return out
