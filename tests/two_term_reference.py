"""What the two-term refinement's tests check against.

- :func:`reference_refine`: the refinement as it was first written, one micro-batch and one
  swap per numpy call, every candidate rebuilding the P ranks' sums (with each max relative
  to its mean, and the fallback to capped swaps for a node whose sum of either term's maxima
  rose, as the refinement now does). Slow (2 to 6 s per 8,000
  records) but plain; ``test_two_term.py`` checks the vectorized ``planner/two_term.py``
  makes exactly its swaps (on integer-valued costs, where every float sum is exact).
- :func:`check_two_terms_refined`: a reader's plan of image-text data is the planner's plan of
  the language term with records moved only within a node and a planning window, neither
  term's maxima raised and some window's score lowered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from conftest import image_components

from bcl_stream.planner import ShardTable, plan_epoch, shard_weights
from bcl_stream.planner.token_contract import planning_window
from bcl_stream.planner.two_term import GUARD_WINDOWS
from bcl_stream.vision.cost import get_two_term_preset

Packs = list[list[npt.NDArray[np.int64]]]


def reference_refine(
    packs: Packs,
    vision: npt.NDArray[np.float64],
    language: npt.NDArray[np.float64],
    ranks_per_node: int,
    *,
    tokens: npt.NDArray[np.integer] | None = None,
    max_tokens: int | None = None,
    iterations: int = 32,
) -> Packs:
    """The plan with records exchanged between the ranks of each node at each micro-batch
    index while J + S drops, capped where a node's free swaps left either term worse (the
    module docstring's rule). ``vision``, ``language``: per-record costs by id;
    ``tokens`` and ``max_tokens``: the budget every micro-batch keeps (None: no budget)."""
    out = [[np.asarray(p, dtype=np.int64)[np.asarray(p) >= 0] for p in rank] for rank in packs]
    if ranks_per_node < 2 or len(out) % ranks_per_node:
        raise ValueError(
            f"ranks_per_node={ranks_per_node} must be >= 2 and divide the {len(out)} ranks"
        )
    if (tokens is None) != (max_tokens is None):
        raise ValueError("give both tokens and max_tokens, or neither")
    v = np.asarray(vision, dtype=np.float64)
    lang = np.asarray(language, dtype=np.float64)
    tok = None if tokens is None else np.asarray(tokens, dtype=np.float64)
    for first in range(0, len(out), ranks_per_node):
        node = out[first : first + ranks_per_node]
        depth = min(len(rank) for rank in node)
        given = [[rank[t] for rank in node] for t in range(depth)]
        free = [_refine_batch(list(b), v, lang, tok, max_tokens, iterations, False) for b in given]
        if any(_maxima(free, term) > _maxima(given, term) for term in (v, lang)):
            free = [
                _refine_batch(list(b), v, lang, tok, max_tokens, iterations, True) for b in given
            ]
        for t, batch in enumerate(free):
            for rank, ids in zip(node, batch, strict=True):
                rank[t] = ids
    return out


def _maxima(batches: list[list[npt.NDArray[np.int64]]], term: npt.NDArray[np.float64]) -> float:
    """The sum over a node's micro-batches of one term's max over its ranks."""
    return sum(max(term[ids].sum() for ids in batch) for batch in batches)


def _refine_batch(
    batch: list[npt.NDArray[np.int64]],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    iterations: int,
    capped: bool,
) -> list[npt.NDArray[np.int64]]:
    """One micro-batch's swaps; ``capped``: none may raise max_r V or max_r L above the
    micro-batch's as given."""
    caps = None
    if capped:
        caps = (max(v[ids].sum() for ids in batch), max(lang[ids].sum() for ids in batch))
    for _ in range(iterations):
        if not _swap_once(batch, v, lang, tok, max_tokens, caps):
            break
    return batch


def _swap_once(
    batch: list[npt.NDArray[np.int64]],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
    caps: tuple[float, float] | None = None,
) -> bool:
    """Apply the best improving swap of one micro-batch across a node's ranks (in place);
    False when none improves."""
    n = len(batch)
    vs = np.array([v[ids].sum() for ids in batch])
    ls = np.array([lang[ids].sum() for ids in batch])
    ks = None if tok is None else np.array([tok[ids].sum() for ids in batch])
    ss = vs + ls
    wv, wl, ws = (n / s.sum() if s.sum() > 0 else 0.0 for s in (vs, ls, ss))
    j_now = vs.max() * wv + ls.max() * wl
    s_now = ss.max() * ws
    eps = 1e-12 * max(j_now, 1.0)
    best: tuple[float, int, int, int, int] | None = None
    for a in sorted({int(np.argmax(vs)), int(np.argmax(ls))}):
        mine = batch[a]
        if mine.size == 0:
            continue
        others = [b for b in range(n) if b != a and batch[b].size]
        if not others:
            continue
        theirs = np.concatenate([batch[b] for b in others])
        owner = np.concatenate([np.full(batch[b].size, b) for b in others])
        slot = np.concatenate([np.arange(batch[b].size) for b in others])
        dv = v[theirs][None, :] - v[mine][:, None]  # (B_a, candidates): a gains, b loses
        dl = lang[theirs][None, :] - lang[mine][:, None]
        new_v = np.broadcast_to(vs, (*dv.shape, n)).copy()
        new_l = np.broadcast_to(ls, (*dv.shape, n)).copy()
        new_v[..., a] += dv
        new_l[..., a] += dl
        cols = np.arange(owner.size)
        new_v[:, cols, owner] -= dv
        new_l[:, cols, owner] -= dl
        both = new_v.max(axis=-1) * wv + new_l.max(axis=-1) * wl + (new_v + new_l).max(axis=-1) * ws
        ok = both < j_now + s_now - eps
        if caps is not None:
            ok &= (new_v.max(axis=-1) <= caps[0]) & (new_l.max(axis=-1) <= caps[1])
        if tok is not None and ks is not None and max_tokens is not None:
            dk = tok[theirs][None, :] - tok[mine][:, None]
            ok &= (ks[a] + dk <= max_tokens) & (ks[owner][None, :] - dk <= max_tokens)
        if not ok.any():
            continue
        score = np.where(ok, both, np.inf)
        row, col = np.unravel_index(int(np.argmin(score)), score.shape)
        if best is None or score[row, col] < best[0]:
            best = (float(score[row, col]), a, int(row), int(owner[col]), int(slot[col]))
    if best is None:
        return False
    _, giver, i, taker, j = best
    mine, theirs_b = batch[giver].copy(), batch[taker].copy()
    mine[i], theirs_b[j] = batch[taker][j], batch[giver][i]
    batch[giver], batch[taker] = mine, theirs_b
    return True


def check_two_terms_refined(
    index: Any, config: Any, packs: npt.NDArray[np.int64], epoch: int, model: str = "qwen2-vl-2b"
) -> None:
    """``packs`` (a reader config's whole-epoch plan of the ``vlm_dirs`` data, -1 padding
    under a budget) is the language term's plan (the planner's, unrefined: the token-only
    balancer's) with records moved only within a node and a planning window: per node and
    window the same records in micro-batches of the same sizes, each within a budget; no
    guard unit's (``GUARD_WINDOWS`` windows) sum over its micro-batches of max_r V or of max_r
    L rises, and the sum of a window's three inverse efficiencies (vision, language, sum)
    drops in some window
    (``planner/two_term.py``)."""
    vision, language = get_two_term_preset(model).terms(image_components(len(index)))
    counts = index.shard_counts
    table = ShardTable.build(counts, weight=shard_weights(counts, language))
    pc = config.plan
    tokens = None if pc.max_tokens is None else np.asarray(index.tokens, dtype=np.int64)
    plain = plan_epoch(language, table, pc, seed=config.seed, epoch=epoch, tokens=tokens).packs
    assert plain.shape == packs.shape
    window = planning_window(pc)

    def sums(part: npt.NDArray[np.int64], term: npt.NDArray[np.float64]) -> Any:
        return np.where(part >= 0, term[part], 0.0).sum(axis=2)  # (ranks, micro-batches)

    def score(part: npt.NDArray[np.int64]) -> float:
        out = 0.0
        for term in (vision, language, vision + language):
            s = sums(part, term)
            if s.sum() > 0:
                out += float(s.max(axis=0).sum() / (s.sum() / s.shape[0]))
        return out

    per_node = pc.ranks_per_node
    lowered = 0
    unit = window * GUARD_WINDOWS
    for node in range(pc.world_size // per_node):
        ranks = slice(node * per_node, (node + 1) * per_node)
        for lo in range(0, packs.shape[1], unit):
            old, new = plain[ranks, lo : lo + unit], packs[ranks, lo : lo + unit]
            for term in (vision, language):
                top_new = sums(new, term).max(axis=0).sum()
                assert top_new <= sums(old, term).max(axis=0).sum() * (1 + 1e-9)
        for lo in range(0, packs.shape[1], window):
            old, new = plain[ranks, lo : lo + window], packs[ranks, lo : lo + window]
            assert sorted(old.ravel().tolist()) == sorted(new.ravel().tolist())
            assert sorted((old >= 0).sum(axis=2).ravel()) == sorted((new >= 0).sum(axis=2).ravel())
            if tokens is not None:
                fed = [tokens[m[m >= 0]].sum() for m in new.reshape(-1, new.shape[2])]
                assert max(fed) <= pc.max_tokens
            lowered += score(new) < score(old) * (1 - 1e-9)
    assert lowered > 0
