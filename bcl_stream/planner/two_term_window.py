"""Window swaps: a two-term candidate that exchanges records anywhere in a node's window, toward
cells of equal vision and language cost.

Why: the other candidates (``two_term.py``) either keep records at their micro-batch index (the
swaps) or deal a window again in one pass (the regroupings, the redeal), and the swaps score
only the maxima of one micro-batch. Where the token-only plan already balances the language
term to a few parts in ten thousand, every move they find that lifts the vision term costs the
language term more than the guard allows (MathVista's `sft` at B = 8: vision 0.90, language
kept). Here a cell is one rank's micro-batch of a window (P ranks x W micro-batches), and each
swap of two records between any two cells of the window is scored on a smooth sum over the
cells, (V / mean V - 1)^2 + w (L / mean L - 1)^2, the means taken over the window's cells. Every
cell close to the mean is what makes each micro-batch index's maximum close to its mean for
both terms at once; the squares let a swap between two cells that hold no maximum count, which
the maxima alone never see; ``LANGUAGE_WEIGHT`` makes a language deviation of 0.1% weigh like
a vision deviation of 1.6%, so the language term ends at least as balanced as the token-only
plan's on the rows measured, and usually better.

The search: each round, in every window at once, the :data:`GIVERS` cells of largest
deviation not yet tried give one of their records for one of any other cell's, the best swap
over all of them is applied if it lowers the sum, and the two cells it changed may give
again; a giver with no improving swap is marked tried until a swap changes it, and a window
ends when every cell is tried (a local minimum of the sum for swaps from any cell). Records
keep their count per cell (a swap is one record for one), their node and window, padding
slots stay put, and under a token budget both cells stay within it.
Deterministic (ties: the lower giver, slot, cell, slot), numpy only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.token_contract import EMPTY
from bcl_stream.planner.two_term_regroup import SlotCosts
from bcl_stream.planner.two_term_swaps import CHUNK_ELEMENTS, fits, swap_slots

LANGUAGE_WEIGHT = 256.0
"""w in the cells' sum. Chosen in exploratory runs on MathVista's rows of
``tools/bench_vlm.py`` where the guard bound (`sft` at B = 8, `mix` at T; no committed command
reproduces those runs, so no figures here): at 64 the 2B `sft` row's language term ended just
below the token-only plan's, at 256 above it with vision over 0.95, and 1,024 and 4,096 kept
the language term and gave up vision. COCO's and TACO's rows check it."""

GIVERS = 2
"""Cells that give per window and round (the most deviant untried ones): 4 gave no better
figures on MathVista's 2B `sft` at B = 8 in an exploratory run, at 1.6x the time."""

MIN_GAIN = 1e-13
"""The least fall of the cells' sum a swap must bring (below it the window's search ends)."""

ROUNDS_PER_CELL = 16
"""Rounds at most, per cell of the largest window: a bound on the search's time. In an
exploratory run on MathVista's 2B `sft` at B = 8, 12 and 32 gave the same figures as 16 and 8
slightly lower ones."""


def window_swapped(
    rows: npt.NDArray[np.int64],
    costs: SlotCosts,
    max_tokens: int | None,
    bounds: list[tuple[int, int]],
    weight: float = LANGUAGE_WEIGHT,
) -> npt.NDArray[np.int64]:
    """``rows`` (micro-batches, ranks, width) with records swapped within each window (rows
    ``lo:hi`` of ``bounds``) toward cells of equal cost (the module docstring); ``costs``:
    (vision, language, tokens or None) of ``rows``' slots, 0 on padding."""
    out = rows.copy()
    if not bounds:
        return out
    _, p, w = rows.shape
    depth = max(hi - lo for lo, hi in bounds)
    n, c = len(bounds), depth * p
    ids = np.full((n, c, w), EMPTY, dtype=np.int64)
    terms = [None if values is None else np.zeros((n, c, w)) for values in costs]
    for k, (lo, hi) in enumerate(bounds):
        cut = slice(0, (hi - lo) * p)
        ids[k, cut] = rows[lo:hi].reshape(-1, w)
        for term, values in zip(terms, costs, strict=True):
            if term is not None and values is not None:
                term[k, cut] = values[lo:hi].reshape(-1, w)
    v, lang, tok = terms
    assert v is not None and lang is not None
    _search(ids, v, lang, tok, max_tokens, weight)
    for k, (lo, hi) in enumerate(bounds):
        out[lo:hi] = ids[k, : (hi - lo) * p].reshape(hi - lo, p, w)
    return out


def _search(
    ids: npt.NDArray[np.int64],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    weight: float,
) -> None:
    """The rounds of swaps over windows (windows, cells, width), every array swapped in place;
    each round scores the active windows in chunks of at most ``CHUNK_ELEMENTS`` candidate
    swaps (windows are independent, so the chunks change nothing but the memory held)."""
    n, c, w = ids.shape
    valid = ids != EMPTY
    cells = valid.any(axis=2)  # cells with records (a short window's missing ones have none)
    count = np.maximum(cells.sum(axis=1), 1)
    means = [term.sum(axis=(1, 2)) / count for term in (v, lang)]
    scale = (np.where(means[0] > 0, means[0], 1.0), np.where(means[1] > 0, means[1], 1.0))
    tried = ~cells
    active = np.flatnonzero(cells.any(axis=1) & (means[0] > 0))
    tried[np.setdiff1d(np.arange(n), active)] = True
    givers = min(GIVERS, c)
    step = max(1, CHUNK_ELEMENTS // (givers * w * c * w))
    state = _State(ids, valid, v, lang, tok, tried, scale)
    for _ in range(ROUNDS_PER_CELL * c):
        if active.size == 0:
            return
        kept = [
            _round(state, active[lo : lo + step], givers, max_tokens, weight)
            for lo in range(0, active.size, step)
        ]
        active = np.sort(np.concatenate(kept))


class _State(NamedTuple):
    """The search's arrays (windows, cells, width) and per-window means (the costs' scale)."""

    ids: npt.NDArray[np.int64]
    valid: npt.NDArray[np.bool_]
    v: npt.NDArray[np.float64]
    lang: npt.NDArray[np.float64]
    tok: npt.NDArray[np.float64] | None
    tried: npt.NDArray[np.bool_]
    scale: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]


def _round(
    s: _State, a: npt.NDArray[np.int64], givers: int, max_tokens: int | None, weight: float
) -> npt.NDArray[np.int64]:
    """One round on windows ``a``: the best swap from each window's most deviant untried
    cells applied where it lowers the sum, those cells marked tried where none does; returns
    the windows still searching."""
    v, lang, tok, valid, tried = s.v, s.lang, s.tok, s.valid, s.tried
    k, c, w = a.size, v.shape[1], v.shape[2]
    vs, ls = v[a].sum(axis=2), lang[a].sum(axis=2)  # (k, cells)
    mva, mla = s.scale[0][a][:, None], s.scale[1][a][:, None]
    dev = (vs / mva - 1) ** 2 + weight * (ls / mla - 1) ** 2
    dev = np.where(tried[a], -np.inf, dev)
    g = np.argsort(-dev, axis=1, kind="stable")[:, :givers]  # (k, givers)
    real = np.isfinite(np.take_along_axis(dev, g, axis=1))
    row = np.arange(k)[:, None]
    gain = _gains(v[a], lang[a], vs, ls, g, row, mva, mla, weight)
    ok = valid[a][row, g][:, :, :, None, None] & valid[a][:, None, None, :, :]
    ok &= (np.arange(c)[None, None, None, :, None] != g[:, :, None, None, None]) & real[
        :, :, None, None, None
    ]
    if tok is not None and max_tokens is not None:  # each (window, giver) one block
        blocks = np.repeat(tok[a], givers, axis=0)
        ok &= fits(blocks, g.ravel(), max_tokens).reshape(ok.shape)
    flat = np.where(ok, gain, np.inf).reshape(k, -1)
    best = np.argmin(flat, axis=1)
    improved = flat[np.arange(k), best] < -MIN_GAIN
    stuck = a[~improved]  # their givers found nothing: tried until a swap changes them
    tried[np.repeat(stuck, givers)[real[~improved].ravel()], g[~improved][real[~improved]]] = True
    done = a[improved]
    gi, i, cell, j = np.unravel_index(best[improved], (givers, w, c, w))
    giver = g[improved][np.arange(done.size), gi]
    swap_slots((s.ids, v, lang, tok), (done, giver, i), (done, cell, j))
    tried[done, giver] = tried[done, cell] = False
    return np.concatenate([done, stuck[~tried[stuck].all(axis=1)]])


def _gains(
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    vs: npt.NDArray[np.float64],
    ls: npt.NDArray[np.float64],
    g: npt.NDArray[np.int64],
    row: npt.NDArray[np.int64],
    mv: npt.NDArray[np.float64],
    ml: npt.NDArray[np.float64],
    weight: float,
) -> npt.NDArray[np.float64]:
    """The change of the cells' sum for every swap (window, giver, its slot, cell, its slot):
    the giver gets the cell's record, the cell the giver's."""
    dv = v[:, None, None, :, :] - v[row, g][:, :, :, None, None]
    dl = lang[:, None, None, :, :] - lang[row, g][:, :, :, None, None]
    at = (slice(None), None, None, None, None)
    mv5, ml5 = mv[:, 0][at], ml[:, 0][at]
    vg, lg = vs[row, g][:, :, None, None, None], ls[row, g][:, :, None, None, None]
    vc, lc = vs[:, None, None, :, None], ls[:, None, None, :, None]

    def cost(vx: npt.NDArray[np.float64], lx: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return (vx / mv5 - 1) ** 2 + weight * (lx / ml5 - 1) ** 2

    return cost(vg + dv, lg + dl) + cost(vc - dv, lc - dl) - cost(vg, lg) - cost(vc, lc)
