"""Equal-cardinality balanced partition: split each window of m*B records into m packs of B.

One algorithm per function, each batched over independent windows (one row per rank, node or
the world), because scope ``rank`` with 1024 ranks plans 1024 windows at once and a Python
loop per window would be the bottleneck.

``lpt_rounds`` (the default) is Longest Processing Time with a cardinality constraint, done in
B rounds: records sorted by decreasing cost; round j hands its m records (the j-th largest
slice) to the m packs, the largest record to the currently lightest pack. Every pack gets
exactly one record per round, so cardinality holds by construction, and each round is one
``argsort`` over m pack loads: O(m*B*log m) per window, fully vectorized. The imbalance left
is bounded by the spread of the last (smallest) round, which on SFT length distributions is
tiny. ``refine_swaps`` then polishes the heaviest and lightest packs by exchanging one record
pair per iteration. ``snake`` (boustrophedon dealing of sorted records) is kept for
comparison: cheaper still, clearly worse on heavy tails (see tools/bench_balance.py).
``padded`` (``padded.py``) groups similar costs instead, for trainers that pad every record
of a pack to its longest.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.checks import window_shape
from bcl_stream.planner.padded import partition_padded

Assignment = npt.NDArray[np.int64]
"""(n_windows, m, B): for each window, the positions (into that window's row) of each pack."""


def lpt_rounds(
    costs: npt.NDArray[np.float64],
    n_packs: int,
    targets: npt.NDArray[np.float64] | None = None,
) -> Assignment:
    """Greedy LPT with cardinality B, in rounds. Output shape (n_windows, n_packs, B).

    With ``targets`` (n_windows, n_packs) each round hands the largest record to the pack
    with the most room left (target - load) instead of the lightest one.
    """
    pack_size = window_shape(costs, n_packs)
    n_windows = costs.shape[0]
    rows = np.arange(n_windows)[:, None]
    by_cost = np.argsort(-costs, axis=1, kind="stable")
    out = np.empty((n_windows, n_packs, pack_size), dtype=np.int64)
    loads = np.zeros((n_windows, n_packs), dtype=np.float64)
    for j in range(pack_size):
        items = by_cost[:, j * n_packs : (j + 1) * n_packs]  # descending within the round
        room = loads if targets is None else loads - targets
        lightest_first = np.argsort(room, axis=1, kind="stable")
        out[rows, lightest_first, j] = items
        loads[rows, lightest_first] += costs[rows, items]
    return out


def snake(costs: npt.NDArray[np.float64], n_packs: int) -> Assignment:
    """Boustrophedon dealing of records sorted by decreasing cost. Output (n_windows, n_packs, B)."""
    pack_size = window_shape(costs, n_packs)
    by_cost = np.argsort(-costs, axis=1, kind="stable")
    dealt = by_cost.reshape(costs.shape[0], pack_size, n_packs).copy()
    dealt[:, 1::2, :] = dealt[:, 1::2, ::-1]
    return np.ascontiguousarray(dealt.transpose(0, 2, 1))


def refine_swaps(
    costs: npt.NDArray[np.float64], assignment: Assignment, iterations: int = 8
) -> Assignment:
    """Exchange one record between the heaviest and the lightest pack of each window, per iteration.

    The exchange chosen brings both packs closest to their mean; windows where no exchange
    lowers the spread are left alone. Pack costs are gathered once and updated in place per
    swap. Output has the same shape as ``assignment``.
    """
    out = assignment.copy()
    n_windows, n_packs, pack_size = out.shape
    if n_packs < 2 or iterations < 1:
        return out
    pack_costs = np.take_along_axis(costs, out.reshape(n_windows, -1), axis=1)
    pack_costs = pack_costs.reshape(n_windows, n_packs, pack_size)
    loads = pack_costs.sum(axis=2)
    active = np.arange(n_windows)
    for _ in range(iterations):
        heavy, light = loads[active].argmax(axis=1), loads[active].argmin(axis=1)
        gap = loads[active, heavy] - loads[active, light]
        delta = pack_costs[active, heavy][:, :, None] - pack_costs[active, light][:, None, :]
        # New spread between the two packs after swapping (i, j): |gap - 2*delta|.
        spread = np.abs(gap[:, None, None] - 2.0 * delta).reshape(active.size, -1)
        best = spread.argmin(axis=1)
        improves = spread[np.arange(active.size), best] < gap - 1e-9 * np.maximum(gap, 1.0)
        if not improves.any():
            break
        i, j = np.divmod(best[improves], pack_size)
        w, hi, lo = active[improves], heavy[improves], light[improves]
        moved = pack_costs[w, hi, i] - pack_costs[w, lo, j]
        out[w, hi, i], out[w, lo, j] = out[w, lo, j].copy(), out[w, hi, i].copy()
        pack_costs[w, hi, i], pack_costs[w, lo, j] = (
            pack_costs[w, lo, j].copy(),
            pack_costs[w, hi, i].copy(),
        )
        loads[w, hi] -= moved
        loads[w, lo] += moved
        active = w  # windows with no improving swap are done
    return out


def stream(costs: npt.NDArray[np.float64], n_packs: int) -> Assignment:
    """No balancing: pack i takes records i*B .. i*B+B-1 of the window (a plain loader)."""
    pack_size = window_shape(costs, n_packs)
    flat = np.arange(n_packs * pack_size, dtype=np.int64).reshape(n_packs, pack_size)
    return np.broadcast_to(flat, (costs.shape[0], n_packs, pack_size)).copy()


ALGORITHMS: dict[str, Callable[[npt.NDArray[np.float64], int], Assignment]] = {
    "lpt": lpt_rounds,
    "snake": snake,
    "stream": stream,
    "padded": partition_padded,
}
UNREFINED = frozenset({"padded", "stream"})
"""Algorithms whose objective is not the balanced sum of a pack's costs: swap refinement, which
balances sums, would undo them (``padded.py``; ``stream`` is the unbalanced baseline)."""


def partition(
    costs: npt.NDArray[np.float64], n_packs: int, algorithm: str = "lpt", refine: int = 8
) -> Assignment:
    """Run a registered algorithm, then ``refine`` swap iterations. Output (n_windows, n_packs, B)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown partition algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}"
        )
    out = ALGORITHMS[algorithm](costs, n_packs)
    return refine_swaps(costs, out, refine) if refine > 0 and algorithm not in UNREFINED else out
