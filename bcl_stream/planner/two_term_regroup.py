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

Indices are ordered heaviest first (the planner's ``desc`` order).

A grouping keeps a micro-batch's images together. Where image sizes span two orders of
magnitude (MathVista: 24 to 5,092 patches), one micro-batch holding two large images caps its
index whatever index it goes to: ``redealt`` deals a window's records again one by one (images
of like cost in runs of P at one index, then the text-only records to even the language
term), each micro-batch keeping its record count, padding slots and token budget. Added after
the groupings, on MathVista's rows (the held-out corpus the groupings missed on) and checked
on COCO's and TACO's: ``tools/bench_vlm.py``'s ``bcl_two_term_packs_whole`` is the rule
without it (MathVista's 2B mix at B = 8: vision efficiency 0.946 without, 0.971 with).

``two_term.py`` refines the plan as given, each grouping and the redeal, and keeps, per guard
unit, the one with the lowest sum of the three inverse efficiencies (vision, language, sum)
among those that leave neither term worse balanced than the plan given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.token_contract import EMPTY

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


SlotCosts = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64] | None]
"""Each slot's (vision, language, tokens) cost, 0 on padding; tokens None without a budget."""


def redealt(
    rows: npt.NDArray[np.int64],
    costs: SlotCosts,
    max_tokens: int | None,
    bounds: list[tuple[int, int]],
) -> npt.NDArray[np.int64]:
    """``rows`` (micro-batches, ranks, width) with each window's records (rows ``lo:hi`` of
    ``bounds``) dealt again one by one (:func:`_redeal`); ``costs``: the rows' slots'. A
    window the deal cannot fill is copied."""
    out = rows.copy()
    v, lang, tok = costs
    for lo, hi in bounds:
        part = (v[lo:hi], lang[lo:hi], None if tok is None else tok[lo:hi])
        dealt = _redeal(rows[lo:hi], part, max_tokens)
        if dealt is not None:
            out[lo:hi] = dealt
    return out


def _redeal(
    ids: npt.NDArray[np.int64], costs: SlotCosts, max_tokens: int | None
) -> npt.NDArray[np.int64] | None:
    """One window's records dealt again, each micro-batch keeping its record count, its padding
    slots and its token budget: None where the window has no image or the deal leaves a record over.

    Why: the groupings move whole micro-batches, so a micro-batch's images stay together. On
    a corpus whose image sizes span two orders of magnitude (MathVista: 24 to 5,092 patches)
    one large image outweighs a rank's share of its micro-batch, and no exchange of whole
    micro-batches or of records at one index helps (vision ceiling 0.87-0.88 on its mix at
    B = 8). Here the images, largest first, are cut in runs of P of like vision cost; run g
    goes to micro-batch index g mod m (m indices in the window), each image of the run to the
    rank of that index with the least language cost so far; then the records without an image,
    costliest language first, each to the micro-batch of least language cost so far in the
    window (longest processing time first). Ties: the earlier slot, rank, index."""
    m, p, _ = ids.shape
    v, lang, tok = costs
    valid = ids != EMPTY
    room = valid.sum(axis=2)
    spots = np.argsort(~valid, axis=2, kind="stable")  # each micro-batch's record slots first
    slot = np.flatnonzero(valid.ravel())
    fv, fl = v.ravel()[slot], lang.ravel()[slot]
    fk = None if tok is None else tok.ravel()[slot]
    seen = fv > 0
    if not seen.any():
        return None
    images = np.flatnonzero(seen)
    images = images[np.lexsort((images, -fv[images]))]
    plain = np.flatnonzero(~seen)
    plain = plain[np.lexsort((plain, -fl[plain]))]
    out = np.full_like(ids, EMPTY)
    count = np.zeros((m, p), dtype=np.int64)
    load = np.zeros((m, p))
    used = np.zeros((m, p))

    def place(i: int, among: npt.NDArray[np.bool_]) -> bool:
        """Record (flat position) ``i`` to the least-loaded micro-batch ``among`` allows."""
        free = among & (count < room)
        if fk is not None and max_tokens is not None:
            free &= used + fk[i] <= max_tokens
        if not free.any():
            return False
        t, r = np.unravel_index(int(np.argmin(np.where(free, load, np.inf))), load.shape)
        out[t, r, spots[t, r, count[t, r]]] = ids.ravel()[slot[i]]
        count[t, r] += 1
        load[t, r] += fl[i]
        if fk is not None:
            used[t, r] += fk[i]
        return True

    for g, first in enumerate(range(0, images.size, p)):
        run = images[first : first + p]
        at = np.zeros((m, p), dtype=bool)
        at[g % m] = True
        for i in run[np.lexsort((run, -fl[run]))]:
            if not place(int(i), at):
                return None
    everywhere = np.ones((m, p), dtype=bool)
    if not all(place(int(i), everywhere) for i in plain):
        return None
    return out
