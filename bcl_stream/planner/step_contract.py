"""The per-step record contract: G*B records per rank per optimizer step, micro-batches vary.

``PlanConfig.contract``:

- ``pack`` (default, the paper's contract): every micro-batch holds exactly B records.
- ``step``: every optimizer step of a rank holds exactly G*B records (the G packs the planner
  gave that step), but they are re-cut into G micro-batches of varying size. Beyond the paper;
  for trainers that count records per optimizer step (loss averaged over the step's records,
  schedulers counting steps), not per micro-batch.

Why: with the padded layout a micro-batch costs its size times its longest record, so B long
records cost far more than B short ones, and the ranks' t-th packs differ as much as their
longest records do. Transformers' ``BatchRebalanceSampler`` (``bcl_stream/peers/hf.py``) wins
there by giving long records small micro-batches and short ones large. Here the same freedom is
taken after BCL has planned the step, in two moves:

1. **Deal** (scopes ``node`` and ``world``, whose ranks share the node's stream): the step's
   records of the node's P ranks, sorted by cost, are dealt to the ranks in snake order
   (0..P-1, P-1..0, ...), G*B each, so every rank's step holds the same cost quantiles. Scope
   ``rank`` keeps each rank's own records (it knows no other rank's).
2. **Cut**: each rank's step, sorted by cost (costliest first, stable), is cut into G contiguous
   micro-batches minimizing the costliest one (size x its first record's cost), so each costs
   about the step's 1/G, and the ranks' t-th micro-batches match because their steps do. The
   micro-batches run costliest first, on every rank alike.

Measured (``tools/bench_balance.py``-style, 131K i.i.d. records, 8 ranks, B=8, G=4, W=16,
padded, time per unit of cost against ``hf_rebalance``): bcl-world 0.975 / 1.237 / 0.831 with
exactly B (gsm8k / sharegpt / alpaca shapes), 1.008 / 1.378 / 0.936 with the cut alone, 1.046 /
1.454 / 1.074 with deal and cut. With the ``packed`` layout a pack costs the sum of its
records, which the planner already balances with exactly B (efficiency ~0.999); a re-cut
only lost 2-6 points there, so under ``packed`` the step contract yields the planner's packs.

A pure function of the step's records and costs: every rank and worker recomputes it, resume
mid-step replays it exactly, and every record of the step is yielded once (a permutation of
the step's records cut into pieces). The last step of an epoch may hold fewer than G packs;
it is re-cut into as many micro-batches as it has packs, so every rank yields the same count.
With a memory cap (``max_tokens``) no micro-batch exceeds it (padded: size x longest length;
packed: the token sum); if no cut within the cap exists the planner's packs are kept.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.padded import check_layout


def _groups_within(
    cost: list[float], tok: list[int] | None, layout: str, limit: float, cap: int | None
) -> list[int] | None:
    """Greedy contiguous cut of ``cost`` (costliest first) into groups costing <= ``limit``
    (and holding <= ``cap`` tokens): the group sizes, or None if a record alone is over."""
    sizes: list[int] = []
    i, n = 0, len(cost)
    while i < n:
        j, total, tokens = i, 0.0, 0
        while j < n:
            if layout == "padded":
                total = (j - i + 1) * cost[i]
                tokens = (j - i + 1) * tok[i] if tok is not None else 0
            else:
                total += cost[j]
                tokens += tok[j] if tok is not None else 0
            if total > limit or (cap is not None and tokens > cap):
                break
            j += 1
        if j == i:
            return None
        sizes.append(j - i)
        i = j
    return sizes


def _split_to(sizes: list[int], n_micro: int) -> list[int]:
    """Split the largest groups (a piece never costs more than its group) until there are
    ``n_micro``; the pieces stay contiguous and in order."""
    out = list(sizes)
    while len(out) < n_micro:
        k = max(range(len(out)), key=lambda g: (out[g], -g))
        half = out[k] // 2
        out[k : k + 1] = [out[k] - half, half]
    return out


def recut_step(
    costs: npt.NDArray[np.float64],
    n_micro: int,
    layout: str,
    tokens: npt.NDArray[np.integer] | None = None,
    max_tokens: int | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """One rank's step re-cut into ``n_micro`` micro-batches.

    ``costs`` (n,) of the step's records in plan order (n >= ``n_micro``), ``tokens`` the
    same records' lengths (needed with ``max_tokens``). Output: (positions (n,), sizes
    (n_micro,)): micro-batch j holds ``positions[sum(sizes[:j]) : sum(sizes[:j+1])]``, the
    micro-batches costliest first, each at least one record."""
    check_layout(layout)
    c = np.asarray(costs, dtype=np.float64)
    n = c.size
    if not 1 <= n_micro <= n:
        raise ValueError(f"need 1 <= micro-batches <= records, got {n_micro} for {n} records")
    order = np.argsort(-c, kind="stable")
    cost = c[order].tolist()
    tok = None
    if max_tokens is not None:
        if tokens is None:
            raise ValueError("max_tokens needs the records' tokens")
        tok = np.asarray(tokens, dtype=np.int64)[order].tolist()
    lo = max(cost[0], sum(cost) / n_micro if layout == "packed" else 0.0)
    hi = (n if layout == "padded" else 1) * max(cost[0], 1e-300) + sum(cost)
    best = _groups_within(cost, tok, layout, hi, max_tokens)
    if best is None or len(best) > n_micro:  # no cut within the cap: the planner's packs
        sizes_kept = [len(part) for part in np.array_split(np.arange(n), n_micro)]
        return np.arange(n, dtype=np.int64), np.asarray(sizes_kept, dtype=np.int64)
    for _ in range(40):  # bisect the costliest micro-batch's cost
        mid = (lo + hi) / 2
        sizes = _groups_within(cost, tok, layout, mid, max_tokens)
        if sizes is not None and len(sizes) <= n_micro:
            best, hi = sizes, mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    sizes = _split_to(best, n_micro)
    starts = np.cumsum(sizes) - sizes
    group_cost = [
        sizes[g] * cost[starts[g]]
        if layout == "padded"
        else sum(cost[starts[g] : starts[g] + sizes[g]])
        for g in range(n_micro)
    ]
    run = sorted(range(n_micro), key=lambda g: (-group_cost[g], g))
    positions = np.concatenate([order[starts[g] : starts[g] + sizes[g]] for g in run])
    return positions.astype(np.int64), np.asarray([sizes[g] for g in run], dtype=np.int64)


def deal_step(
    node_step: npt.NDArray[np.int64], costs: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """(P, g, B) record ids of one step of a node's P ranks -> (P, g*B): the same records dealt
    in snake order of cost (costliest first, stable), so every rank gets the same quantiles."""
    p = node_step.shape[0]
    ids = np.asarray(node_step, dtype=np.int64).ravel()
    ranked = ids[np.argsort(-np.asarray(costs[ids], dtype=np.float64), kind="stable")]
    turn = np.arange(ranked.size).reshape(-1, p)
    turn[1::2] = turn[1::2, ::-1]
    return ranked[turn.T]


def node_micro_batches(
    packs: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    grad_accum: int,
    layout: str,
    group: int,
    tokens: npt.NDArray[np.integer] | None = None,
    max_tokens: int | None = None,
) -> list[list[npt.NDArray[np.int64]]]:
    """Every rank's micro-batches under the ``step`` contract: ``packs`` (R, n, B), ranks in
    groups of ``group`` consecutive ranks that share a stream (1: scope ``rank``). Output
    ``[rank][micro-batch]``, n per rank. ``packed``: the packs themselves."""
    if check_layout(layout) == "packed":
        return [list(rank) for rank in packs]
    out: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(packs.shape[0])]
    for lo in range(0, packs.shape[0], group):
        for k in range(0, packs.shape[1], grad_accum):
            step = packs[lo : lo + group, k : k + grad_accum]
            dealt = deal_step(step, costs) if group > 1 else step.reshape(1, -1)
            for r, ids in enumerate(dealt):
                g = step.shape[1]
                tok = None if tokens is None else np.asarray(tokens)[ids]
                positions, sizes = recut_step(costs[ids], g, layout, tok, max_tokens)
                out[lo + r].extend(np.split(ids[positions], np.cumsum(sizes)[:-1]))
    return out
