"""Transformers' batch rebalance, reproduced exactly: the ``hf_rebalance`` peer.

Follows huggingface/transformers 5.23.0 (``transformers/trainer_pt_utils.py``,
``BatchRebalanceSampler``; selected by ``TrainingArguments(train_sampling_strategy=
"batch_rebalance")``, built in ``Trainer._get_train_sampler`` with ``effective_batch_size`` =
per-device batch x gradient accumulation x world size). Re-implemented from reading that code,
line for line where it matters: its float cost, its stable sorts, its ``max``/``min`` tie
rules and the iteration order of its ``set`` of slot members are Python's, as upstream.

What the sampler does for each optimizer step, on every rank alike (shared seed, no
communication):

1. take the next ``effective_batch_size`` records of the epoch order (upstream:
   ``torch.randperm`` seeded with ``seed + epoch``, seed 42 by default);
2. sort them by length, longest first (stable);
3. cut the sorted list into K = dp_size * grad_accum contiguous groups, equal counts first,
   then hill-climb the counts: move one record from the costliest group to the cheapest one
   until the spread stops shrinking (a cycle of counts), keeping the lowest-spread counts seen.
   A group's cost is its padded cost ``bs * max_len + 0.001 * bs * max_len**2``. When the
   costliest group is down to one record its whole slot is topped up from cheaper groups (never
   above its cost) and frozen;
4. sort the groups by cost, costliest first, and deal them slot by slot: slot k (the k-th
   micro-batch of the step) gets groups ranked [k*dp, (k+1)*dp), rank r the r-th of those.

So every step holds exactly ``effective_batch_size`` records, but a micro-batch holds as many
as its group: long records in small micro-batches, short ones in large. It plans on its own
cost formula (lengths, padded); the simulator scores the result with the user's cost model
like every other strategy. Its horizon is one optimizer step, and every process holds the
whole epoch's lengths and reads a global shuffle.

The shuffle is torch's and is not reproduced: :func:`rebalance_epoch` takes the epoch order as
an argument (the fidelity fixtures carry the real sampler's order; the simulator gives it the
same numpy global shuffle as the other pooled peers).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from bcl_stream.peers.pools import Bins, Pool, Remainder

TRANSFORMERS_VERSION = "5.23.0"
QUADRATIC_COST_COEF = 0.001
"""``BatchRebalanceSampler.QUADRATIC_COST_COEF``: the weight of the attention term."""


def padded_cost(bs: int, max_len: int) -> float:
    """``BatchRebalanceSampler._cost``, evaluated in upstream's order (float arithmetic)."""
    return bs * max_len + QUADRATIC_COST_COEF * bs * max_len * max_len


def _group_costs(counts: list[int], lengths: Sequence[int]) -> list[float]:
    """Cost of each contiguous group of ``lengths`` (sorted longest first) cut by ``counts``."""
    out: list[float] = []
    start = 0
    for c in counts:
        out.append(padded_cost(c, lengths[start]) if c > 0 else 0.0)
        start += c
    return out


def _slot_groups(costs: list[float], pivot: int, dp_size: int) -> set[int]:
    """``_slot_groups``: the groups ranked in ``pivot``'s slot (a set, iterated as upstream)."""
    ranking = sorted(range(len(costs)), key=lambda i: costs[i], reverse=True)
    start = (ranking.index(pivot) // dp_size) * dp_size
    return set(ranking[start : min(start + dp_size, len(costs))])


def _relieve_and_freeze(
    counts: list[int],
    slot_members: set[int],
    pivot: int,
    frozen: set[int],
    lengths: Sequence[int],
    cap_cost: float,
) -> None:
    """``_relieve_and_freeze``: top up the pivot's slot from cheaper outside groups, never
    above ``cap_cost``, then freeze the slot."""
    k = len(counts)
    for gi in slot_members:
        if gi in frozen or gi == pivot:
            continue
        while True:
            costs_now = _group_costs(counts, lengths)
            start = sum(counts[:gi])
            max_len = lengths[start] if counts[gi] > 0 else 0
            if padded_cost(counts[gi] + 1, max_len) > cap_cost:
                break
            donors = [
                i for i in range(k) if i not in frozen and i not in slot_members and counts[i] > 1
            ]
            if not donors:
                break
            donor = min(donors, key=lambda i: costs_now[i])
            counts[gi] += 1
            counts[donor] -= 1
    frozen.update(slot_members)


def balance_counts(
    lengths: Sequence[int], dp_size: int, grad_accum: int, effective_batch_size: int
) -> list[int]:
    """``_balance_groups``: record counts of the K contiguous groups of ``lengths`` (sorted
    longest first). ``effective_batch_size`` only bounds the iterations, as upstream."""
    n, k = len(lengths), dp_size * grad_accum
    if n < k:
        raise ValueError(
            f"cannot fill {k} groups (dp_size {dp_size} x grad_accum {grad_accum}) with "
            f"{n} records; Transformers refuses it too: use a larger batch"
        )
    base, extra = divmod(n, k)
    counts = [base + (1 if i < extra else 0) for i in range(k)]
    frozen: set[int] = set()
    seen: set[tuple[int, ...]] = set()
    best_spread = math.inf
    best_counts = list(counts)
    for _ in range(max(k * 30, effective_batch_size)):
        key = tuple(counts)
        if key in seen:
            break
        seen.add(key)
        costs = _group_costs(counts, lengths)
        active = [i for i in range(k) if i not in frozen]
        if len(active) <= 1:
            break
        active_costs = [costs[i] for i in active]
        spread = max(active_costs) - min(active_costs)
        if spread < best_spread:
            best_spread = spread
            best_counts = list(counts)
        hi = max(active, key=lambda i: costs[i])
        if costs[hi] == costs[min(active, key=lambda i: costs[i])]:
            break
        transferred = False
        for lo in sorted(active, key=lambda i: costs[i]):
            if lo == hi or costs[lo] == costs[hi]:
                continue
            if counts[hi] > 1:
                counts[hi] -= 1
                counts[lo] += 1
                transferred = True
                break
        if not transferred:
            if counts[hi] > 1:
                break
            members = _slot_groups(costs, hi, dp_size)
            _relieve_and_freeze(counts, members, hi, frozen, lengths, costs[hi])
    return best_counts


def rebalance_global_batch(
    ids: Sequence[int],
    lengths: Sequence[int],
    dp_size: int,
    grad_accum: int,
    effective_batch_size: int | None = None,
) -> list[list[list[int]]]:
    """``_assign``: ``[rank][slot]`` lists of ``ids`` for one global batch (``lengths`` of
    the same records), each group longest first, as the sampler yields them."""
    pairs = sorted(
        zip((int(i) for i in ids), (int(x) for x in lengths), strict=True),
        key=lambda p: p[1],
        reverse=True,
    )
    ordered = [length for _, length in pairs]
    ebs = len(pairs) if effective_batch_size is None else effective_batch_size
    counts = balance_counts(ordered, dp_size, grad_accum, ebs)
    starts = [sum(counts[:g]) for g in range(len(counts))]
    costs = _group_costs(counts, ordered)
    ranked = sorted(range(len(counts)), key=lambda g: costs[g], reverse=True)
    out: list[list[list[int]]] = [[[] for _ in range(grad_accum)] for _ in range(dp_size)]
    for slot in range(grad_accum):
        for r in range(dp_size):
            g = ranked[slot * dp_size + r]
            out[r][slot] = [i for i, _ in pairs[starts[g] : starts[g] + counts[g]]]
    return out


def rebalance_epoch(
    order: Sequence[int],
    lengths: Sequence[int],
    effective_batch_size: int,
    dp_size: int,
    grad_accum: int,
    drop_last: bool = True,
) -> list[list[list[list[int]]]]:
    """``BatchRebalanceSampler.__iter__`` for every rank at once, given the epoch ``order``:
    ``[global batch][rank][slot]`` record ids.

    ``drop_last=False`` (the Trainer's default ``dataloader_drop_last``) also yields the last
    partial global batch, padded with records from the start of the order when it holds fewer
    than K = dp_size * grad_accum (those records then run twice in the epoch)."""
    if min(dp_size, grad_accum) < 1 or effective_batch_size < dp_size * grad_accum:
        raise ValueError(
            f"need dp_size, grad_accum >= 1 and effective_batch_size >= dp_size * grad_accum, "
            f"got {effective_batch_size}, {dp_size}, {grad_accum}"
        )
    ids = [int(i) for i in order]
    n_full, rest = divmod(len(ids), effective_batch_size)
    has_tail = not drop_last and rest > 0
    k = dp_size * grad_accum
    out = []
    for gb in range(n_full + (1 if has_tail else 0)):
        batch = ids[gb * effective_batch_size : (gb + 1) * effective_batch_size]
        if has_tail and gb == n_full and len(batch) < k:
            pad = k - len(batch)
            batch = batch + (ids * math.ceil(pad / len(ids)))[:pad]
        out.append(
            rebalance_global_batch(
                batch, [lengths[i] for i in batch], dp_size, grad_accum, effective_batch_size
            )
        )
    return out


def hf_rebalance(pool: Pool) -> tuple[Bins, Remainder]:
    """Transformers' batch rebalance with ``per_device_train_batch_size`` = B, as the Trainer
    builds it (``effective_batch_size`` = R*B*G).

    Output: ``[rank][micro-batch]`` arrays of record ids, G per global batch, sizes varying
    (exactly R*B*G records per step over all ranks; a rank's share and each micro-batch vary),
    and ``{"epoch_tail": ids}`` for the last partial global batch, left out as for the other
    pooled peers (the Trainer's ``dataloader_drop_last=True``)."""

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        ranks = rebalance_global_batch(
            members.tolist(),
            pool.tokens[members].tolist(),
            pool.world_size,
            pool.grad_accum,
            members.size,
        )
        for r, slots in enumerate(ranks):
            for micro in slots:
                yield r, np.asarray(micro, dtype=np.int64)

    return pool.deal(plan_batch)
