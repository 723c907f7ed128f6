"""Expectations for what loaders yield, computed without the planner: the properties every
epoch must have, and the exact packs of the one case simple enough to write down by hand.

Kept free of bcl_stream so a test's expectation cannot come from the code it checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Packs = Sequence[Sequence[Sequence[int]]]
"""packs[rank][t] = the record ids of rank ``rank``'s t-th pack."""


def check_epoch(packs: Packs, n_records: int, pack_size: int, left_out: int) -> None:
    """Every rank yields the same number of packs of exactly ``pack_size`` records, no record
    twice, and the records yielded plus the ``left_out`` ones reported are the epoch's
    ``n_records``."""
    counts = [len(rank) for rank in packs]
    assert len(set(counts)) == 1, f"ranks yield different pack counts: {counts}"
    sizes = {len(pack) for rank in packs for pack in rank}
    assert sizes <= {pack_size}, f"pack sizes {sorted(sizes)}, want exactly {pack_size}"
    ids = [int(i) for rank in packs for pack in rank for i in pack]
    assert len(ids) == len(set(ids)), "a record was yielded twice"
    assert all(0 <= i < n_records for i in ids)
    assert len(ids) + left_out == n_records, (len(ids), left_out, n_records)


def write_order_packs(
    n_records: int, ranks: int, pack_size: int, window: int
) -> tuple[list[list[list[int]]], int]:
    """``packing="sequential"``, ``shuffle=False``, one node: the node's stream is the write
    order 0..n-1, cut into chunks of ``window`` packs per rank; rank r takes the r-th slice
    of every chunk, in consecutive packs of ``pack_size`` (the last chunk holds as many whole
    packs per rank as the records left allow). Returns (packs by rank, records left over)."""
    packs: list[list[list[int]]] = [[] for _ in range(ranks)]
    start = 0
    while (per_rank := min(window, (n_records - start) // (ranks * pack_size))) > 0:
        for rank in range(ranks):
            first = start + rank * per_rank * pack_size
            for t in range(per_rank):
                packs[rank].append(list(range(first + t * pack_size, first + (t + 1) * pack_size)))
        start += ranks * per_rank * pack_size
    return packs, n_records - start


def balance_efficiency(packs: Packs, costs: np.ndarray) -> float:
    """``sum_t mean_r C[r,t] / sum_t max_r C[r,t]`` with C the pack cost from ``costs``."""
    cost = np.array([[float(costs[list(pack)].sum()) for pack in rank] for rank in packs])
    return float(cost.mean(axis=0).sum() / cost.max(axis=0).sum())
