"""Pack cost by layout and the padded partition: every record once, exactly B per pack, the
padded cost computed as B x max, and sorted chunks never waste more than any other split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once

from bcl_stream.planner.padded import (
    LAYOUTS,
    pack_cost,
    padding_waste,
    partition_padded,
    ragged_pack_costs,
)
from bcl_stream.planner.partition import ALGORITHMS, lpt_rounds, partition


def test_pack_cost_is_the_sum_when_packed_and_b_times_the_max_when_padded() -> None:
    packs = np.array([[[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]], [[0.0, 0.0, 9.0], [4.0, 1.0, 1.0]]])
    assert pack_cost(packs, "packed").tolist() == [[6.0, 15.0], [9.0, 6.0]]
    assert pack_cost(packs, "padded").tolist() == [[9.0, 15.0], [27.0, 12.0]]
    assert padding_waste(packs).tolist() == [[3.0, 0.0], [18.0, 6.0]]
    assert pack_cost(np.zeros((2, 0)), "padded").tolist() == [0.0, 0.0]


def test_unknown_layout_is_a_value_error_listing_the_choices() -> None:
    with pytest.raises(ValueError, match=r"layout must be one of \('packed', 'padded'\)"):
        pack_cost(np.ones((2, 2)), "ragged")
    with pytest.raises(ValueError, match="layout"):
        ragged_pack_costs([[np.array([0])]], np.ones(1), "jagged")


def test_ragged_packs_score_like_the_array_and_missing_packs_cost_zero() -> None:
    values = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    array = np.array([[[0, 1], [2, 3]], [[4, 5], [1, 3]]])
    for layout in LAYOUTS:
        as_lists = [[np.array(p) for p in rank] for rank in array]
        assert np.array_equal(
            ragged_pack_costs(as_lists, values, layout), ragged_pack_costs(array, values, layout)
        )
    bins = [[np.array([0, 1, 2]), np.array([5])], [np.array([3, 4])]]
    assert ragged_pack_costs(bins, values, "padded").tolist() == [[12.0, 9.0], [10.0, 0.0]]
    assert ragged_pack_costs(bins, values, "packed").tolist() == [[8.0, 9.0], [6.0, 0.0]]


windows = st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**16))


def _padded_total(costs: np.ndarray, assign: np.ndarray) -> np.ndarray:
    rows = np.arange(costs.shape[0])[:, None, None]
    return pack_cost(costs[rows, assign], "padded").sum(axis=1)


@settings(max_examples=150, deadline=None)
@given(windows, st.sampled_from(["lognormal", "ties", "pareto"]))
def test_padded_partition_invariants_and_never_more_waste(
    shape: tuple[int, int, int, int], kind: str
) -> None:
    n_windows, m, b, seed = shape
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        costs = rng.lognormal(5.0, 1.2, (n_windows, m * b))
    elif kind == "ties":
        costs = rng.integers(1, 4, (n_windows, m * b)).astype(np.float64)
    else:
        costs = 64.0 * (1.0 + rng.pareto(1.3, (n_windows, m * b)))
    assign = partition_padded(costs, m)
    assert assign.shape == (n_windows, m, b)
    for w in range(n_windows):
        check_every_record_once(assign[w], m * b, what=f"window {w}")
    rows = np.arange(n_windows)[:, None, None]
    packed = costs[rows, assign]
    # Nested packs: every record of pack j costs at most every record of pack j+1.
    assert np.all(packed[:, :-1, :].max(axis=2) <= packed[:, 1:, :].min(axis=2))
    best = _padded_total(costs, assign)
    stream = np.arange(m * b).reshape(1, m, b).repeat(n_windows, axis=0)  # sequential's split
    shuffled = np.stack([rng.permutation(m * b).reshape(m, b) for _ in range(n_windows)])
    for other in (stream, shuffled, lpt_rounds(costs, m)):
        total = _padded_total(costs, other)
        assert np.all(best <= total * (1 + 1e-12))
        waste = total - costs.sum(axis=1)
        assert np.all(best - costs.sum(axis=1) <= waste * (1 + 1e-12) + 1e-9)


@pytest.mark.parametrize(("m", "b"), [(2, 3), (3, 2), (2, 4), (4, 2)])
def test_sorted_chunks_are_optimal_against_every_split(m: int, b: int) -> None:
    rng = np.random.default_rng(m * 10 + b)
    costs = rng.lognormal(4.0, 1.0, (1, m * b))
    best = _padded_total(costs, partition_padded(costs, m))[0]
    every = min(
        _padded_total(costs, np.array(p).reshape(1, m, b))[0]
        for p in itertools.permutations(range(m * b))
    )
    assert best == pytest.approx(every)


def test_padded_is_registered_and_never_refined() -> None:
    assert ALGORITHMS["padded"] is partition_padded
    costs = np.random.default_rng(3).lognormal(5.0, 1.0, (5, 64))
    assert np.array_equal(partition(costs, 8, "padded", refine=8), partition_padded(costs, 8))
    # The refinement would have moved records: it balances sums, not maxima.
    assert not np.array_equal(partition(costs, 8, "lpt", refine=8), partition_padded(costs, 8))


@pytest.mark.parametrize(
    ("shape", "n_packs", "match"),
    [((8,), 2, "2-D"), ((2, 9), 2, "equal packs"), ((2, 8), 0, "n_packs")],
)
def test_bad_partition_arguments_are_value_errors(
    shape: tuple[int, ...], n_packs: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        partition_padded(np.ones(shape), n_packs)
