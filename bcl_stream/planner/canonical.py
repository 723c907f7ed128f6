"""Canonical ranks, the pure part: a plan for V canonical ranks as R physical ranks run it.

Physical rank r of R runs canonical ranks r*k .. r*k+k-1 (k = V/R): at each optimizer step the
k*G_c packs those ranks hold in that step, as its micro-batches. Their order is chosen for
per-micro-batch balance (FSDP synchronizes every micro-batch): heaviest first by estimated
cost, ties in canonical order (micro-batch, then hosted rank). The planner balanced every
canonical micro-batch across the V ranks, so the m-th heaviest pack of one physical rank runs
beside the m-th heaviest of every other. The order depends on the costs only: identical in
every process, for any number of DataLoader workers. Readers walk it lazily
(``bcl_stream/epoch/canonical.py``); the simulator and the benchmark score whole plans
(:func:`physical_packs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def step_order(step: npt.NDArray[np.int64], costs: Any, balanced: bool) -> npt.NDArray[np.int64]:
    """One physical rank's micro-batches of one step: ``step`` (k, g, B) canonical packs ->
    (k*g, B), heaviest first (ties: canonical micro-batch, then hosted rank); ``balanced``
    False (the ``sequential`` baseline) keeps canonical order: micro-batch t of every hosted
    rank, then t+1."""
    packs = step.transpose(1, 0, 2).reshape(-1, step.shape[2])
    if not balanced or packs.shape[0] < 2:
        return packs
    cost = np.asarray(costs[packs.ravel()], dtype=np.float64).reshape(packs.shape).sum(axis=1)
    return packs[np.argsort(-cost, kind="stable")]


def physical_packs(
    packs: npt.NDArray[np.int64], costs: Any, ranks: int, grad_accum: int, balanced: bool = True
) -> npt.NDArray[np.int64]:
    """A whole canonical plan's packs (V, n, B) as ``ranks`` physical ranks run them:
    (R, n*V/R, B), each step's micro-batches in :func:`step_order` (the simulator and the
    benchmark score it; readers walk the same order lazily, :class:`CanonicalPlan`)."""
    v, n, _ = packs.shape
    if v % ranks:
        raise ValueError(f"{ranks} physical ranks do not divide {v} canonical ranks")
    k = v // ranks
    out = [
        np.concatenate(
            [
                step_order(packs[r * k : r * k + k, s : s + grad_accum], costs, balanced)
                for s in range(0, n, grad_accum)
            ]
            or [np.empty((0, packs.shape[2]), dtype=np.int64)]
        )
        for r in range(ranks)
    ]
    return np.stack(out)
