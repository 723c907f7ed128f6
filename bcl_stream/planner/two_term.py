"""Two-term refinement: after a plan balances the summed cost, balance each term too.

Why: BCL balances one cost per record, the sum of the vision encoder's and the language
model's (``bcl_stream.vision.cost``). When the encoder runs as its own stage, each micro-batch
takes max_r V + max_r L, not max_r (V + L): a plan balanced in sum can still leave one rank
with most of a micro-batch's images. This pass exchanges records between the ranks of one
node at the same micro-batch index, so no rank's record count, no micro-batch's position in
the epoch and no node's records change (the node's stream and its locality are untouched):

- a swap (record i of rank a for record j of rank b) is kept only if it lowers J + S, the
  micro-batch's time with the encoder as its own stage (J = max_r V + max_r L) plus its time
  with the encoder in one step (S = max_r (V + L)): the two ways a trainer runs it. Requiring
  S never to rise instead (J lowered, S kept) stalls where long text-only records fill the
  ranks (a mixture): on the tune half of ``tools/bench_vlm.py`` it left the vision efficiency
  at 0.884 (qwen2-vl-2b mix, B=8) where J + S reaches 0.958, for one-stage time 0.16% higher;
- under a token budget the swapped micro-batches stay within it;
- rank a is a rank holding max_r V or max_r L; the best swap over every other rank and every
  record pair (B x (P-1)B candidates, vectorized) is applied, at most ``iterations`` times per
  micro-batch.

Deterministic (ties to the lowest index), numpy only, O(packs x iterations x P*B^2): 2.2 s
(B=8) and 6.3 s (T=16,384, about 28 records per micro-batch) for 8,000 records on one core of
a shared machine: a simulator's and a benchmark's pass, too slow yet for a reader's per-window
planning at scale. Called
only where records carry a vision cost; text-only plans never reach it, so their plans (and
``tools/plan_hashes.py``) are unchanged.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.padded import Packs

Ragged = list[list[npt.NDArray[np.int64]]]
"""``packs[r][t]``: record ids of rank r's t-th micro-batch (no -1 padding)."""

ITERATIONS = 32
"""Swaps per micro-batch at most. Chosen on the tune half of ``tools/bench_vlm.py`` (sft,
qwen2-vl-7b, 1 x 8, 8,000 records): vision efficiency 0.919 / 0.968 / 0.981 / 0.985 / 0.986 /
0.986 at B=8 and 0.953 / 0.983 / 0.992 / 0.998 / 0.999 / 0.999 at T=16,384 for
0 / 4 / 8 / 16 / 32 / 64 swaps: the third decimal stops moving at 32."""


def ragged(packs: Packs) -> Ragged:
    """Any plan's packs as lists of id arrays, -1 padding (the tokens contract's) dropped."""
    return [[np.asarray(p, dtype=np.int64)[np.asarray(p) >= 0] for p in rank] for rank in packs]


def refine_two_terms(
    packs: Packs,
    vision: npt.NDArray[np.float64],
    language: npt.NDArray[np.float64],
    ranks_per_node: int,
    *,
    tokens: npt.NDArray[np.integer] | None = None,
    max_tokens: int | None = None,
    iterations: int = ITERATIONS,
) -> Ragged:
    """The plan with records exchanged between the ranks of each node at each micro-batch
    index while J + S drops (the module docstring's rule). ``vision``, ``language``: per-record costs by id;
    ``tokens`` and ``max_tokens``: the budget every micro-batch keeps (None: no budget)."""
    out = ragged(packs)
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
        for t in range(depth):
            batch = [rank[t] for rank in node]
            for _ in range(iterations):
                if not _swap_once(batch, v, lang, tok, max_tokens):
                    break
            for rank, ids in zip(node, batch, strict=True):
                rank[t] = ids
    return out


def _swap_once(
    batch: list[npt.NDArray[np.int64]],
    v: npt.NDArray[np.float64],
    lang: npt.NDArray[np.float64],
    tok: npt.NDArray[np.float64] | None,
    max_tokens: int | None,
) -> bool:
    """Apply the best improving swap of one micro-batch across a node's ranks (in place);
    False when none improves."""
    n = len(batch)
    vs = np.array([v[ids].sum() for ids in batch])
    ls = np.array([lang[ids].sum() for ids in batch])
    ks = None if tok is None else np.array([tok[ids].sum() for ids in batch])
    j_now = vs.max() + ls.max()
    s_now = (vs + ls).max()
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
        both = new_v.max(axis=-1) + new_l.max(axis=-1) + (new_v + new_l).max(axis=-1)
        ok = both < j_now + s_now - eps
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
