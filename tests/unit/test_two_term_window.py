"""Window swaps (``planner/two_term_window.py``): what they keep, what they lower, and a hand
example that only a swap across micro-batch indices balances."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_strategies import SEEDS

from bcl_stream.planner.token_contract import EMPTY
from bcl_stream.planner.two_term import refine_packs
from bcl_stream.planner.two_term_window import LANGUAGE_WEIGHT, window_swapped


def slot_costs(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.where(rows != EMPTY, values[np.where(rows != EMPTY, rows, 0)], 0.0)


def cells_sum(rows: np.ndarray, v: np.ndarray, lang: np.ndarray, lo: int, hi: int) -> float:
    """The sum the search lowers, over window rows ``lo:hi`` (its cells with records)."""
    vs = slot_costs(rows[lo:hi], v).sum(axis=2).ravel()
    ls = slot_costs(rows[lo:hi], lang).sum(axis=2).ravel()
    live = (rows[lo:hi] != EMPTY).any(axis=2).ravel()
    if not live.any() or vs[live].mean() <= 0:
        return 0.0  # nothing to balance: the search leaves the window alone
    mv, ml = vs[live].mean(), ls[live].mean()
    return float(((vs[live] / mv - 1) ** 2 + LANGUAGE_WEIGHT * (ls[live] / ml - 1) ** 2).sum())


def test_a_swap_across_indices_lowers_what_no_swap_at_one_index_can() -> None:
    """Two ranks, two micro-batch indices, two records a cell, every cell's language 4: the
    vision maxima are 6 (index 0) + 4 (index 1). No exchange at one index lowers them with the
    language kept, so the refinement that keeps records at their index (``in_place``) leaves
    10. Trading record 7 (vision 3, language 3; rank 0 at index 0) for record 1 (vision 1,
    language 3; rank 1 at index 1) keeps every cell's language and makes the maxima 4 + 5."""
    vision = np.array([2.0, 1.0, 3.0, 2.0, 2.0, 3.0, 0.0, 3.0])
    language = np.array([3.0, 3.0, 2.0, 1.0, 1.0, 1.0, 2.0, 3.0])
    rows = np.array([[[7, 5], [6, 2]], [[3, 0], [4, 1]]])  # (index, rank, slot)

    def maxima(ids: np.ndarray, values: np.ndarray) -> float:
        return float(slot_costs(ids, values).sum(axis=2).max(axis=1).sum())

    packs = rows.transpose(1, 0, 2)  # (rank, index, slot)
    kept = refine_packs(packs, vision, language, 2, rule="in_place", window=2).transpose(1, 0, 2)
    assert maxima(kept, vision) == 10.0
    costs = (slot_costs(rows, vision), slot_costs(rows, language), None)
    out = window_swapped(rows, costs, None, [(0, 2)])
    assert maxima(out, vision) == 9.0
    assert slot_costs(out, language).sum(axis=2).tolist() == [[4.0, 4.0], [4.0, 4.0]]
    assert sorted(out.ravel().tolist()) == list(range(8))


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, 6),
    ranks=st.integers(2, 4),
    width=st.integers(1, 4),
    span=st.integers(1, 4),
    budget=st.booleans(),
    images=st.floats(0.0, 1.0),
    seed=SEEDS,
)
def test_invariants(
    depth: int, ranks: int, width: int, span: int, budget: bool, images: float, seed: int
) -> None:
    """Per window: the same records, each once; every micro-batch keeps its record count and
    its padding slots; a budget every micro-batch kept is kept; the cells' sum never rises;
    the result is the same on a second run."""
    rng = np.random.default_rng(seed)
    n = depth * ranks * width
    rows = rng.permutation(n).reshape(depth, ranks, width)
    rows[rng.random(rows.shape) < 0.2] = EMPTY
    vision = np.where(rng.random(n) < images, rng.lognormal(3.0, 1.0, n), 0.0)
    tokens = rng.integers(1, 50, n).astype(np.float64)
    language = tokens * (1.0 + rng.random(n))
    max_tokens = None
    if budget:
        max_tokens = int(slot_costs(rows, tokens).sum(axis=2).max())
    bounds = [(lo, min(lo + span, depth)) for lo in range(0, depth, span)]
    costs = (
        slot_costs(rows, vision),
        slot_costs(rows, language),
        slot_costs(rows, tokens) if budget else None,
    )
    out = window_swapped(rows, costs, max_tokens, bounds)
    assert np.array_equal(out, window_swapped(rows, costs, max_tokens, bounds))
    assert np.array_equal(out == EMPTY, rows == EMPTY)
    for lo, hi in bounds:
        assert sorted(out[lo:hi].ravel().tolist()) == sorted(rows[lo:hi].ravel().tolist())
        assert (
            cells_sum(out, vision, language, lo, hi)
            <= cells_sum(rows, vision, language, lo, hi) + 1e-9
        )
    if max_tokens is not None:
        assert slot_costs(out, tokens).sum(axis=2).max() <= max_tokens
