"""Two-term refinement: after a plan balances the summed cost, balance each term too.

Why: BCL balances one cost per record, the sum of the vision encoder's and the language
model's (``bcl_stream.vision.cost``). When the encoder runs as its own stage, each micro-batch
takes max_r V + max_r L, not max_r (V + L): a plan balanced in sum can still leave one rank
with most of a micro-batch's images. This pass exchanges records between the ranks of one
node at the same micro-batch index, so no rank's record count, no micro-batch's position in
the epoch and no node's records change (the node's stream and its locality are untouched):

- a swap (record i of rank a for record j of rank b) is kept only if it lowers J + S, the
  micro-batch's time with the encoder as its own stage (J = max_r V + max_r L) plus its time
  with the encoder in one step (S = max_r (V + L)): the two ways a trainer runs it. Each max
  is taken relative to its mean over the ranks (max_r V / mean_r V + max_r L / mean_r L +
  max_r (V + L) / mean_r (V + L): a swap keeps the means, so this is each term's imbalance,
  weighed alike whichever network is the larger). In absolute FLOPs the larger term drowns
  the smaller one (vision efficiency 0.946 against 0.960 relative, qwen2-vl-7b mix, B=8, on
  the tune half of ``tools/bench_vlm.py``, refining the summed cost's plan). Requiring S
  never to rise instead (J lowered, S kept) stalls where long text-only records fill the
  ranks (vision efficiency 0.884 against 0.958, qwen2-vl-2b mix, B=8);
- no term ends worse balanced than the plan given. The readers refine the language term's
  plan (the token-only balancer's), and J + S alone may trade some of its language balance
  for the encoder's: refining the summed cost's plan left the language term up to 0.017
  below the token-only balancer's (qwen2-vl-2b mix at T = 16,384). So the swaps are first
  made freely; a node whose sum over its micro-batches of max_r V or of max_r L (each term's
  efficiency denominator: the numerator, the term's total, no swap changes) ends above the
  plan given's is refined again from that plan with capped swaps: none may raise the
  micro-batch's max_r V or max_r L above its max as given. Capped swaps alone stall early
  (``tools/bench_vlm.py``'s tune sft and mix rows: vision efficiency 0.913 to 0.987 where this
  rule reaches 0.955 to 0.998); the free ones were kept on every node of every row there, so
  the caps are a guarantee more than a path (``rule`` runs either half alone);
- under a token budget the swapped micro-batches stay within it;
- rank a is a rank holding max_r V or max_r L; the best swap over every other rank and every
  record pair is applied (ties to the lowest rank, then record slot), at most ``iterations``
  times per micro-batch.

Speed: every micro-batch of a node is refined at once (twice for a node refined again). One
iteration scores, for each micro-batch still improving and each of its (one or two) givers,
every candidate swap as a (B, P, B) array: the new maxima are those of the two ranks involved
and the largest of the others, so no candidate rebuilds the P ranks' sums.
``tools/bench_two_term.py`` (``results/bench_two_term.json``, 1 x 8, qwen2-vl-2b, held-out sft
and mix, a loaded 2-core machine): 44 to 179 us per record, 2.5 to 4.2 times faster than the
first implementation, with the same swaps, but 17 to 31 times the planning it refines; beside
an image's decode (8.9 ms for a 640 x 480 JPEG, ``results/bench_image_headers.json``) it is
about 2%. The readers apply it on every batch of windows they plan (``epoch/terms.py``).
Deterministic, numpy only.
Called only where records carry a vision cost; text-only plans never reach it, so their
plans (and ``tools/plan_hashes.py``) are unchanged.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.padded import Packs

Ragged = list[list[npt.NDArray[np.int64]]]
"""``packs[r][t]``: record ids of rank r's t-th micro-batch (no -1 padding)."""

EMPTY = -1
"""A padding slot (the token contract's ``EMPTY``): never swapped."""

ITERATIONS = 32
"""Swaps per micro-batch at most. Chosen under the absolute weighing, on the tune half of ``tools/bench_vlm.py`` (sft,
qwen2-vl-7b, 1 x 8, 8,000 records): vision efficiency 0.919 / 0.968 / 0.981 / 0.985 / 0.986 /
0.986 at B=8 and 0.953 / 0.983 / 0.992 / 0.998 / 0.999 / 0.999 at T=16,384 for
0 / 4 / 8 / 16 / 32 / 64 swaps: the third decimal stops moving at 32."""

RULES = ("guarded", "free", "capped")
"""``guarded``: free swaps, capped ones again for a node they left worse (the readers' rule);
``free``, ``capped``: either half alone."""

CHUNK_ELEMENTS = 1 << 21
"""Candidate swaps scored per numpy call at most (micro-batches are taken in chunks so one
call's arrays stay a few tens of MB whatever the micro-batch width)."""


def ragged(packs: Packs) -> Ragged:
    """Any plan's packs as lists of id arrays, -1 padding (the tokens contract's) dropped."""
    return [[np.asarray(p, dtype=np.int64)[np.asarray(p) >= 0] for p in rank] for rank in packs]


def _check(
    n_ranks: int, ranks_per_node: int, tokens: object | None, max_tokens: int | None
) -> None:
    if ranks_per_node < 2 or n_ranks % ranks_per_node:
        raise ValueError(
            f"ranks_per_node={ranks_per_node} must be >= 2 and divide the {n_ranks} ranks"
        )
    if (tokens is None) != (max_tokens is None):
        raise ValueError("give both tokens and max_tokens, or neither")


def refine_packs(
    packs: npt.NDArray[np.int64],
    vision: npt.ArrayLike,
    language: npt.ArrayLike,
    ranks_per_node: int,
    *,
    tokens: npt.ArrayLike | None = None,
    max_tokens: int | None = None,
    iterations: int = ITERATIONS,
    rule: str = "guarded",
) -> npt.NDArray[np.int64]:
    """A copy of ``packs`` (ranks, micro-batches, width; ``EMPTY`` pads a short micro-batch)
    with records exchanged between the ranks of each node (``ranks_per_node`` consecutive
    ranks) at each micro-batch index while J + S drops (the module docstring's rule).
    ``vision``, ``language``: per-record costs by id (memory-mapped arrays work: only the
    plan's ids are read); ``tokens`` and ``max_tokens``: the budget every micro-batch keeps
    (None: no budget). Padding slots stay where they are. ``rule``: ``guarded`` (the module
    docstring's), or one of its halves alone, ``free`` or ``capped`` (for benchmarks that
    weigh it: ``tools/bench_vlm.py``)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    out = np.array(packs, dtype=np.int64, copy=True)
    if out.ndim != 3:
        raise ValueError(f"packs must be (ranks, micro-batches, width), got shape {out.shape}")
    _check(out.shape[0], ranks_per_node, tokens, max_tokens)
    if out.size == 0 or iterations < 1:
        return out
    n_nodes = out.shape[0] // ranks_per_node
    # (nodes * micro-batches, ranks_per_node, width): one row per micro-batch of a node
    rows = out.reshape(n_nodes, ranks_per_node, *out.shape[1:]).transpose(0, 2, 1, 3)
    rows = np.ascontiguousarray(rows).reshape(-1, ranks_per_node, out.shape[2])
    _refine_rows(rows, vision, language, tokens, max_tokens, iterations, n_nodes, rule)
    back = rows.reshape(n_nodes, out.shape[1], ranks_per_node, out.shape[2]).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(back).reshape(out.shape)


def refine_two_terms(
    packs: Packs,
    vision: npt.ArrayLike,
    language: npt.ArrayLike,
    ranks_per_node: int,
    *,
    tokens: npt.ArrayLike | None = None,
    max_tokens: int | None = None,
    iterations: int = ITERATIONS,
    rule: str = "guarded",
) -> Ragged:
    """:func:`refine_packs` on any plan's packs (ranks may hold ragged micro-batches and
    different numbers of them, as the simulator's peers do): micro-batch indices every rank
    of a node holds are refined, the rest kept."""
    out = ragged(packs)
    _check(len(out), ranks_per_node, tokens, max_tokens)
    for first in range(0, len(out), ranks_per_node):
        node = out[first : first + ranks_per_node]
        depth = min(len(rank) for rank in node)
        width = max((p.size for rank in node for p in rank[:depth]), default=0)
        if depth == 0 or width == 0:
            continue
        dense = np.full((ranks_per_node, depth, width), EMPTY, dtype=np.int64)
        for r, rank in enumerate(node):
            for t, ids in enumerate(rank[:depth]):
                dense[r, t, : ids.size] = ids
        done = refine_packs(
            dense,
            vision,
            language,
            ranks_per_node,
            tokens=tokens,
            max_tokens=max_tokens,
            iterations=iterations,
            rule=rule,
        )
        for r, rank in enumerate(node):
            for t in range(depth):
                rank[t] = done[r, t, : rank[t].size]
    return out


def _refine_rows(
    rows: npt.NDArray[np.int64],
    vision: npt.ArrayLike,
    language: npt.ArrayLike,
    tokens: npt.ArrayLike | None,
    max_tokens: int | None,
    iterations: int,
    n_nodes: int,
    rule: str,
) -> None:
    """Refine every micro-batch of ``rows`` (micro-batches, ranks, width; node-major: each
    node's micro-batches one block) in place: free swaps first; then each node whose sum over
    its micro-batches of max_r V or of max_r L rose is refined again from its plan as given,
    under caps (the module docstring's rule)."""
    m, p, w = rows.shape
    valid = rows != EMPTY
    safe = np.where(valid, rows, 0)

    def gather(values: npt.ArrayLike | None) -> npt.NDArray[np.float64] | None:
        if values is None:
            return None
        taken = np.asarray(np.asarray(values)[safe.ravel()], dtype=np.float64).reshape(m, p, w)
        return np.where(valid, taken, 0.0)

    def refine(
        ids: npt.NDArray[np.int64],
        ok: npt.NDArray[np.bool_],
        vis: npt.NDArray[np.float64],
        lan: npt.NDArray[np.float64],
        tks: npt.NDArray[np.float64] | None,
        capped: bool,
    ) -> None:
        """:func:`_refine_chunk` over ``ids`` and its arrays (all swapped in place alike), in
        chunks of at most ``CHUNK_ELEMENTS`` candidates per numpy call."""
        step = max(1, CHUNK_ELEMENTS // (2 * w * p * w))
        for lo in range(0, ids.shape[0], step):
            at = slice(lo, lo + step)
            k = None if tks is None else tks[at]
            _refine_chunk(ids[at], ok[at], vis[at], lan[at], k, max_tokens, iterations, capped)

    v, lang, tok = gather(vision), gather(language), gather(tokens)
    assert v is not None and lang is not None
    if rule != "guarded":
        refine(rows, valid, v, lang, tok, rule == "capped")
        return
    start = rows.copy()
    before = _node_maxima(v, lang, n_nodes)
    free_v, free_l = v.copy(), lang.copy()
    free_tok = None if tok is None else tok.copy()
    refine(rows, valid, free_v, free_l, free_tok, False)  # swaps move valid slots only
    worse = np.flatnonzero((_node_maxima(free_v, free_l, n_nodes) > before).any(axis=1))
    if worse.size == 0:
        return
    depth = m // n_nodes
    redo = (worse[:, None] * depth + np.arange(depth)).ravel()
    part = start[redo]
    refine(part, valid[redo], v[redo], lang[redo], None if tok is None else tok[redo], True)
    rows[redo] = part


def _node_maxima(
    v: npt.NDArray[np.float64], lang: npt.NDArray[np.float64], n_nodes: int
) -> npt.NDArray[np.float64]:
    """(nodes, 2): each node's sum over its micro-batches of max_r V and of max_r L (the
    denominators of its vision and language efficiency)."""
    maxima = np.stack([v.sum(axis=2).max(axis=1), lang.sum(axis=2).max(axis=1)], axis=1)
    return maxima.reshape(n_nodes, -1, 2).sum(axis=1)


def _refine_chunk(
    ids: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    iterations: int,
    capped: bool,
) -> None:
    """Up to ``iterations`` best swaps in each micro-batch (arrays (m, ranks, width), all
    swapped in place), only the micro-batches that improved last time scored again;
    ``capped``: no swap may raise max_r V or max_r L above the micro-batch's as given."""
    p = ids.shape[1]
    active = np.arange(ids.shape[0])
    ranks = np.arange(p)
    caps = (v.sum(axis=2).max(axis=1), lang.sum(axis=2).max(axis=1)) if capped else None
    for _ in range(iterations):
        if active.size == 0:
            return
        found = _best_swaps(
            valid[active], v[active], lang[active], None if tok is None else tok[active],
            max_tokens, ranks, None if caps is None else (caps[0][active], caps[1][active]),
        )  # fmt: skip
        improved, a, i, b, j = found
        rows = active[improved]
        for arr in (ids, valid, v, lang) if tok is None else (ids, valid, v, lang, tok):
            mine = arr[rows, a, i].copy()
            arr[rows, a, i] = arr[rows, b, j]
            arr[rows, b, j] = mine
        active = rows


def _best_swaps(
    valid: npt.NDArray[np.bool_],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    ranks: npt.NDArray[np.int64],
    caps: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None,
) -> tuple[npt.NDArray[np.bool_], ...]:
    """The best J + S-lowering swap of each micro-batch: (which improve, and for those the
    giving rank, its slot, the taking rank, its slot). Givers: the rank holding max_r V and
    the one holding max_r L, scored once where they are one rank; ties go to the lower
    giver, then the lower slot, taker and slot. ``caps``: per micro-batch, the max_r V and
    max_r L no swap may exceed (None: no cap)."""
    m, p, w = v.shape
    rows = np.arange(m)
    vs, ls = v.sum(axis=2), lang.sum(axis=2)
    ss = vs + ls
    wv, wl, ws = (_per_mean(sums) for sums in (vs, ls, ss))
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
        t_k = tok[at]
        ks = t_k.sum(axis=2)
        dk = t_k[:, None, :, :] - t_k[np.arange(k), giver][:, :, None, None]
        fits = ks[np.arange(k), giver][:, None, None, None] + dk <= max_tokens
        fits &= ks[:, None, :, None] - dk <= max_tokens
        both = np.where(fits, both, np.inf)
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


def _per_mean(sums: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """1 / (the mean over ranks) of each micro-batch's per-rank ``sums`` (m, ranks), 0 where
    they are all 0 (a term the micro-batch does not have weighs nothing). A swap keeps every
    total, so these weights are constants of the micro-batch."""
    total = sums.sum(axis=1)
    return np.where(total > 0, sums.shape[1] / np.where(total > 0, total, 1.0), 0.0)
