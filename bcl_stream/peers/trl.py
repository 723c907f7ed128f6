"""TRL's token-budget batcher, reproduced: the ``trl_token_budget`` peer.

Follows huggingface/trl at revision f2cd57710ae345ea6428ae95363267fcf38a3dc8,
``trl/experimental/async_grpo/async_grpo_trainer.py`` (``TokenBudgetBatcher``, used by
``AsyncGRPOTrainer`` when ``token_budget > 0``). Re-implemented from reading that code; its
tie-breaking (Python's ``min`` over row indices: the lowest index wins) is kept.

How it plans: one process (the main process; the others iterate an empty dataset) reads the
samples in arrival order and keeps one open row per data-parallel rank. Each sample goes, in
that order and without sorting, into the row with the smallest running sum of squared lengths
(sum L^2, its attention-cost proxy) among the rows whose tokens plus the sample's stay within
``token_budget``. When the sample fits no row, the micro-batch (one row per rank, every row
non-empty) is emitted and a new one opened with that sample. A sample longer than the budget
is dropped with a warning. accelerate's ``DataLoaderDispatcher`` (``dispatch_batches=True``)
then scatters row r to rank r: a central planner, whose micro-batch counts are equal on every
rank by construction. The last open micro-batch when the source ends is never emitted (the
loop ends without yielding it). Gradient accumulation takes G consecutive micro-batches as one
step. Records per micro-batch vary: it breaks the record-count contract.

The issue that asked for this peer called it "rank-0 LPT on sum L^2": LPT (longest first into
the least loaded row) is TRL's ``FixedCountBatcher`` (``_balance_by_squared_length``), which
buffers a fixed count of samples and bounds no memory; ``TokenBudgetBatcher`` is the greedy
above, in arrival order.
"""

from __future__ import annotations

import numpy as np

from bcl_stream.peers.pools import Bins, Pool, Remainder
from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG

TRL_REVISION = "f2cd57710ae345ea6428ae95363267fcf38a3dc8"


def token_budget_batches(lengths: list[int], n_rows: int, budget: int) -> list[list[list[int]]]:
    """``TokenBudgetBatcher.__iter__`` on positions: every emitted micro-batch as ``n_rows``
    rows of positions into ``lengths``, in emission order. Samples longer than ``budget`` and
    the last open micro-batch are not in the output (the caller reports them)."""
    out: list[list[list[int]]] = []
    rows: list[list[int]] = [[] for _ in range(n_rows)]
    squared = [0] * n_rows
    counts = [0] * n_rows
    for i, n in enumerate(lengths):
        if n > budget:
            continue
        fits = [r for r in range(n_rows) if counts[r] + n <= budget]
        if not fits:
            out.append(rows)
            rows = [[] for _ in range(n_rows)]
            squared = [0] * n_rows
            counts = [0] * n_rows
            fits = list(range(n_rows))
        r = min(fits, key=lambda j: squared[j])
        rows[r].append(i)
        squared[r] += n * n
        counts[r] += n
    return out


def trl_token_budget(pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """TRL's ``TokenBudgetBatcher`` at ``token_budget`` = ``capacity`` over the pool's order.

    Output: ``[rank][micro-batch]`` record ids, every rank the same count; the remainder: the
    records of the last open micro-batch and any after it (``epoch_tail``) and the records
    longer than the budget (``longer_than_max_tokens``, which TRL drops with a warning)."""
    order = pool.order
    tok = pool.tokens[order]
    batches = token_budget_batches(tok.tolist(), pool.world_size, capacity)
    per_rank: Bins = [[] for _ in range(pool.world_size)]
    emitted = np.zeros(order.size, dtype=bool)
    for batch in batches:
        for r, row in enumerate(batch):
            positions = np.asarray(row, dtype=np.int64)
            per_rank[r].append(order[positions])
            emitted[positions] = True
    long = tok > capacity
    remainder: Remainder = {REASON_TAIL: order[~emitted & ~long]}
    if long.any():
        remainder[REASON_TOO_LONG] = order[long]
    return per_rank, remainder
