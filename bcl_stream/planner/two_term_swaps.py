"""The two-term swap engine (``planner/two_term.py``'s rule): within each micro-batch, the best
exchange of a record between two ranks of a node, repeated while it lowers J + S.

Why its own module: the rule (which candidates, which guard, which choice per unit) and the
engine (scoring every candidate swap of many micro-batches at once in numpy) change for
different reasons; the engine is the hot path the readers pay per record
(``tools/bench_two_term.py``).

Speed: one iteration scores, for each micro-batch still improving and each of its (one or
two) givers, every candidate swap as a (B, P, B) array: the new maxima are those of the two
ranks involved and the largest of the others, so no candidate rebuilds the P ranks' sums.
Each refinement gathers the per-slot costs of its rows once, swaps them beside the ids, and
returns the windows' figures from the swapped costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.token_contract import EMPTY  # a padding slot: never swapped
from bcl_stream.planner.two_term_regroup import window_figures

CHUNK_ELEMENTS = 1 << 21
"""Candidate swaps scored per numpy call at most (micro-batches are taken in chunks so one
call's arrays stay a few tens of MB whatever the micro-batch width)."""


class Swaps:
    """The swap engine over rows (micro-batches, ranks, width) of one shape: each term's cost
    per slot, swaps in place, and each window's figures (``unit[row]``: the row's window, of
    ``n_windows``)."""

    def __init__(
        self,
        shape: tuple[int, ...],
        vision: npt.ArrayLike,
        language: npt.ArrayLike,
        tokens: npt.ArrayLike | None,
        max_tokens: int | None,
        iterations: int,
        unit: npt.NDArray[np.int64],
        n_windows: int,
    ) -> None:
        self.shape = shape
        self.terms = (vision, language, tokens)
        self.max_tokens, self.iterations = max_tokens, iterations
        self.unit, self.n_windows = unit, n_windows

    def gathered(self, ids: npt.NDArray[np.int64]) -> list[npt.NDArray[np.float64] | None]:
        """[vision, language, tokens] of ``ids``' slots, 0 on padding (tokens None without a
        budget)."""
        valid = ids != EMPTY
        safe = np.where(valid, ids, 0).ravel()
        out: list[npt.NDArray[np.float64] | None] = []
        for values in self.terms:
            if values is None:
                out.append(None)
                continue
            got = np.asarray(np.asarray(values)[safe], dtype=np.float64).reshape(self.shape)
            out.append(np.where(valid, got, 0.0))
        return out

    def refine(
        self,
        ids: npt.NDArray[np.int64],
        capped: bool,
        at: npt.NDArray[np.int64],
        language_only: bool = False,
    ) -> npt.NDArray[np.float64]:
        """:func:`refine_chunk` over rows ``at`` of ``ids`` in place, in chunks of at most
        ``CHUNK_ELEMENTS`` candidates per numpy call; returns the windows' figures after."""
        v, lang, tok = self.gathered(ids)
        assert v is not None and lang is not None
        part, pv, pl = ids[at], v[at], lang[at]
        pk = None if tok is None else tok[at]
        ok = part != EMPTY
        _, p, w = self.shape
        step = max(1, CHUNK_ELEMENTS // (2 * w * p * w))
        for lo in range(0, part.shape[0], step):
            cut = slice(lo, lo + step)
            k = None if pk is None else pk[cut]
            refine_chunk(
                part[cut], ok[cut], pv[cut], pl[cut], k, self.max_tokens, self.iterations,
                capped, language_only,
            )  # fmt: skip
        ids[at], v[at], lang[at] = part, pv, pl
        return window_figures(v, lang, self.unit, self.n_windows)


def refine_chunk(
    ids: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    iterations: int,
    capped: bool,
    language_only: bool = False,
) -> None:
    """Up to ``iterations`` best swaps in each micro-batch (arrays (m, ranks, width), all
    swapped in place), only the micro-batches that improved last time scored again;
    ``capped``: no swap may raise max_r V or max_r L above the micro-batch's as given;
    ``language_only``: the swaps lower max_r L alone (the repair of ``two_term._choose``)."""
    p = ids.shape[1]
    active = np.arange(ids.shape[0])
    ranks = np.arange(p)
    caps = (v.sum(axis=2).max(axis=1), lang.sum(axis=2).max(axis=1)) if capped else None
    for _ in range(iterations):
        if active.size == 0:
            return
        found = best_swaps(
            valid[active], v[active], lang[active], None if tok is None else tok[active],
            max_tokens, ranks, None if caps is None else (caps[0][active], caps[1][active]),
            language_only,
        )  # fmt: skip
        improved, a, i, b, j = found
        rows = active[improved]
        swap_slots((ids, v, lang, tok), (rows, a, i), (rows, b, j))
        active = rows


def swap_slots(
    arrays: tuple[npt.NDArray[Any] | None, ...],
    first: tuple[npt.NDArray[Any], ...],
    second: tuple[npt.NDArray[Any], ...],
) -> None:
    """Exchange the slots at ``first`` and ``second`` (index tuples) in every array given (None:
    skipped). Only records are swapped, never padding, so the padding mask stays as it is."""
    for arr in arrays:
        if arr is None:
            continue
        mine = arr[first].copy()
        arr[first] = arr[second]
        arr[second] = mine


def best_swaps(
    valid: npt.NDArray[np.bool_],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    ranks: npt.NDArray[np.int64],
    caps: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None,
    language_only: bool = False,
) -> tuple[npt.NDArray[np.bool_], ...]:
    """The best J + S-lowering swap of each micro-batch: (which improve, and for those the
    giving rank, its slot, the taking rank, its slot). Givers: the ranks holding max_r V and
    max_r L (one block where they are one rank); ties go to the lower giver, slot, taker and
    slot. ``caps``: per micro-batch, the max_r V and max_r L no swap may exceed (None: no
    cap). ``language_only``: the score is max_r L alone."""
    m, p, w = v.shape
    rows = np.arange(m)
    vs, ls = v.sum(axis=2), lang.sum(axis=2)
    ss = vs + ls
    wv, wl, ws = (per_mean(sums) for sums in (vs, ls, ss))
    wv, ws = (wv * 0, ws * 0) if language_only else (wv, ws)
    j_now = vs.max(axis=1) * wv + ls.max(axis=1) * wl
    s_now = ss.max(axis=1) * ws
    limit = j_now + s_now - 1e-12 * np.maximum(j_now, 1.0)
    a_v, a_l = np.argmax(vs, axis=1), np.argmax(ls, axis=1)
    second = np.flatnonzero(a_v != a_l)  # micro-batches whose two givers differ
    at = np.concatenate([rows, second])  # one candidate block per (micro-batch, giver)
    giver = np.concatenate([np.minimum(a_v, a_l), np.maximum(a_v, a_l)[second]])
    k = at.size
    # the largest sum over the ranks other than giver a and taker b: (k, p)
    others = (ranks[None, None, :] != giver[:, None, None]) & (
        ranks[None, None, :] != ranks[None, :, None]
    )

    def rest(sums: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.where(others, sums[at][:, None, :], -np.inf).max(axis=2)

    ex_v, ex_l, ex_s = rest(vs), rest(ls), rest(ss)
    # candidate axes (k, i, taker, j)
    v_k, l_k = v[at], lang[at]
    dv = v_k[:, None, :, :] - v_k[np.arange(k), giver][:, :, None, None]  # a gains, b loses
    dl = l_k[:, None, :, :] - l_k[np.arange(k), giver][:, :, None, None]
    vs_a = vs[at, giver][:, None, None, None]
    ls_a = ls[at, giver][:, None, None, None]
    vs_b = vs[at][:, None, :, None]
    ls_b = ls[at][:, None, :, None]
    new_va, new_vb = vs_a + dv, vs_b - dv
    new_la, new_lb = ls_a + dl, ls_b - dl
    ex = (slice(None), None, slice(None), None)
    max_v = np.maximum(np.maximum(new_va, new_vb), ex_v[ex])
    max_l = np.maximum(np.maximum(new_la, new_lb), ex_l[ex])
    max_s = np.maximum(np.maximum(new_va + new_la, new_vb + new_lb), ex_s[ex])
    per = (slice(None), None, None, None)
    both = max_v * wv[at][per] + max_l * wl[at][per] + max_s * ws[at][per]
    if caps is not None:
        within = (max_v <= caps[0][at][per]) & (max_l <= caps[1][at][per])
        both = np.where(within, both, np.inf)
    # a padding slot on either side, or the giver as its own taker: never a candidate
    valid_k = valid[at]
    mine = np.where(valid_k[np.arange(k), giver], 0.0, np.inf)[:, :, None, None]
    theirs = valid_k & (ranks[None, :, None] != giver[:, None, None])
    both += mine + np.where(theirs, 0.0, np.inf)[:, None, :, :]
    if tok is not None and max_tokens is not None:
        both = np.where(fits(tok[at], giver, max_tokens), both, np.inf)
    flat = both.reshape(k, -1)
    best = np.argmin(flat, axis=1)
    score = flat[np.arange(k), best]
    score = np.where(score < limit[at], score, np.inf)
    pick = np.arange(m)  # the first giver's block, unless the second's is strictly better
    later = m + np.arange(second.size)
    better = score[later] < score[second]
    pick[second[better]] = later[better]
    improved = np.isfinite(score[pick])
    chosen = pick[improved]
    i, b, j = np.unravel_index(best[chosen], (w, p, w))
    return improved, giver[chosen], i, b, j


def fits(
    t_k: npt.NDArray[np.float64], giver: npt.NDArray[np.int64], max_tokens: int
) -> npt.NDArray[np.bool_]:
    """Candidate swaps (k, i, taker, j) of the candidate blocks' tokens ``t_k`` (k, ranks,
    width) after which both micro-batches involved stay within ``max_tokens``."""
    k = t_k.shape[0]
    ks = t_k.sum(axis=2)
    dk = t_k[:, None, :, :] - t_k[np.arange(k), giver][:, :, None, None]
    fits = ks[np.arange(k), giver][:, None, None, None] + dk <= max_tokens
    return fits & (ks[:, None, :, None] - dk <= max_tokens)


def per_mean(sums: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """1 / (the mean over ranks) of each micro-batch's per-rank ``sums`` (m, ranks), 0 where
    they are all 0 (a term the micro-batch does not have weighs nothing). A swap keeps every
    total, so these weights are constants of the micro-batch."""
    total = sums.sum(axis=1)
    return np.where(total > 0, sums.shape[1] / np.where(total > 0, total, 1.0), 0.0)
