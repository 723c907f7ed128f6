"""Planner invariants: exact pack size, equal pack counts, each record at most once, remainder
accounting, determinism by (seed, epoch), the memory cap, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once
from plan_strategies import SEEDS, Grid, grids
from shard_tables import lognormal_lengths, table_for

from bcl_stream.errors import PlanError
from bcl_stream.peers import Pool, global_order
from bcl_stream.peers.mffd import mffd, pooled_mffd_split
from bcl_stream.planner import PlanConfig, plan_epoch
from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG
from bcl_stream.planner.partition import lpt_rounds, partition, snake

lengths = lognormal_lengths


def plan(costs, config: PlanConfig, tokens=None, *, seed: int = 0, epoch: int = 0, shard: int = 64):
    costs = np.asarray(costs, dtype=float)
    return plan_epoch(costs, table_for(costs, shard), config, seed=seed, epoch=epoch, tokens=tokens)


def check_accounting(plan, n: int) -> None:
    check_every_record_once(plan.packs, n, left_out=plan.remainder)


configs = st.builds(
    lambda nodes, rpn, b, w, scope, algo, order, carry, accum, stratify, split, span: PlanConfig(
        world_size=nodes * rpn,
        ranks_per_node=rpn,
        pack_size=b,
        window=w,
        scope=scope,
        algorithm=algo,
        pack_order=order,
        carry=None if carry is None else carry % (w * b),
        grad_accum=accum,
        stratify=stratify,
        split_shards=split,
        shard_group=2,
        carry_span=span,
    ),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 9),
    st.integers(1, 6),
    st.sampled_from(["rank", "node", "world"]),
    st.sampled_from(["lpt", "snake", "stream"]),
    st.sampled_from(["desc", "stream"]),
    st.one_of(st.none(), st.integers(0, 100)),
    st.integers(1, 4),
    st.booleans(),
    st.sampled_from([0.0, 0.5]),
    st.sampled_from([0, 1, 3, 64]),
)


@settings(max_examples=200, deadline=None)
@given(
    config=configs,
    n=st.integers(0, 700),
    shard=st.integers(1, 90),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 5),
)
def test_plan_invariants(config: PlanConfig, n: int, shard: int, seed: int, epoch: int) -> None:
    tok = lengths(n, seed)
    result = plan(tok, config, tok, seed=seed, epoch=epoch, shard=shard)
    assert result.packs.shape[0] == config.world_size
    assert result.packs.shape[2] == config.pack_size
    check_accounting(result, n)


def test_epochs_and_seeds_change_the_plan() -> None:
    tok = lengths(4096)
    config = PlanConfig(world_size=4, pack_size=8, window=4)
    plans = [
        plan(tok, config, seed=seed, epoch=epoch).packs for seed, epoch in [(0, 0), (0, 1), (1, 0)]
    ]
    assert not np.array_equal(plans[0], plans[1])
    assert not np.array_equal(plans[0], plans[2])
    assert np.array_equal(plans[0], plan(tok, config).packs)


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
def test_wider_scopes_balance_better_than_sequential(scope: str) -> None:
    tok = lengths(20000)
    config = PlanConfig(world_size=8, ranks_per_node=4, pack_size=8, window=16, scope=scope)
    cost = tok.astype(float) ** 1.2

    def efficiency(packs: np.ndarray) -> float:
        c = cost[packs].sum(axis=2)
        return float(c.mean(axis=0).sum() / c.max(axis=0).sum())

    bcl = efficiency(plan(cost, config).packs)
    seq = efficiency(plan_epoch(cost, table_for(cost), config, balanced=False).packs)
    assert bcl > seq + 0.1


def test_scope_world_balances_every_step_tightly() -> None:
    tok = lengths(8 * 8 * 64)
    cost = tok.astype(float)
    result = plan(
        cost,
        PlanConfig(world_size=8, ranks_per_node=8, pack_size=8, window=64, scope="node"),
        seed=3,
    )
    c = cost[result.packs].sum(axis=2)
    assert (c.max(axis=0) / c.mean(axis=0)).max() < 1.05


def test_memory_cap_excludes_outliers_and_bounds_every_pack() -> None:
    tok = lengths(5000, seed=1)
    tok[:7] = 30000
    cap = 12000
    config = PlanConfig(world_size=4, pack_size=4, window=8, max_tokens=25000, scope="rank")
    result = plan(tok, config, tok)
    check_every_record_once(result.remainder[REASON_TOO_LONG], 7)
    check_accounting(result, tok.size)
    tok[:7] = 100
    capped = PlanConfig(world_size=4, pack_size=4, window=8, max_tokens=cap)
    result = plan(tok.astype(float) ** 2, capped, tok)
    assert tok[result.packs].sum(axis=2).max() <= cap
    check_accounting(result, tok.size)


def test_memory_cap_that_cannot_be_met_raises_plan_error() -> None:
    tok = np.full(64, 100)
    config = PlanConfig(world_size=1, pack_size=8, window=8, max_tokens=500)
    with pytest.raises(PlanError, match="max_tokens=500"):
        plan(tok, config, tok)


def test_remainder_reason_is_epoch_tail() -> None:
    result = plan(np.ones(100), PlanConfig(world_size=3, pack_size=8, window=2), shard=100)
    assert result.n_packs == 4
    assert result.remainder_counts() == {REASON_TAIL: 4}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pack_size": 0}, "pack_size"),
        ({"window": 0}, "window"),
        ({"world_size": 0}, "world_size"),
        ({"world_size": 6, "ranks_per_node": 4}, "ranks_per_node=4 does not divide world_size=6"),
        ({"scope": "galaxy"}, "scope"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"algorithm": "magic"}, "algorithm"),
    ],
)
def test_bad_config_raises_value_error_naming_the_argument(kwargs: dict, match: str) -> None:
    base = {"world_size": 2, "pack_size": 2, "window": 2}
    with pytest.raises(ValueError, match=match):
        PlanConfig(**{**base, **kwargs})


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_bad_costs_raise_value_error_naming_the_index(bad: float) -> None:
    costs = np.ones(10)
    costs[3] = bad
    with pytest.raises(ValueError, match=r"costs\[3\]"):
        plan(costs, PlanConfig(world_size=1, pack_size=2, window=1))


def test_empty_input_gives_an_empty_plan() -> None:
    result = plan(np.ones(0), PlanConfig(world_size=2, pack_size=2, window=2))
    assert result.packs.shape == (2, 0, 2)
    assert result.records_left == 0


@settings(max_examples=100, deadline=None)
@given(
    windows=st.integers(1, 4), m=st.integers(1, 12), b=st.integers(1, 8), seed=st.integers(0, 999)
)
@pytest.mark.parametrize("algorithm", [lpt_rounds, snake])
def test_partition_is_a_permutation_of_each_window(
    algorithm, windows: int, m: int, b: int, seed: int
) -> None:
    costs = np.random.default_rng(seed).exponential(size=(windows, m * b))
    out = algorithm(costs, m)
    assert out.shape == (windows, m, b)
    refined = partition(costs, m, "lpt", refine=8)
    for w in range(windows):
        check_every_record_once(out[w], m * b, what=f"window {w}")
        check_every_record_once(refined[w], m * b, what=f"window {w}, refined")


def test_refinement_never_worsens_the_spread() -> None:
    costs = np.random.default_rng(0).pareto(1.5, size=(50, 256))
    raw = lpt_rounds(costs, 32)
    refined = partition(costs, 32, "lpt", refine=16)

    def spread(a: np.ndarray) -> np.ndarray:
        loads = np.take_along_axis(costs, a.reshape(50, -1), axis=1).reshape(a.shape).sum(axis=2)
        return loads.max(axis=1) - loads.min(axis=1)

    assert np.all(spread(refined) <= spread(raw) + 1e-9)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 100), min_size=0, max_size=80), capacity=st.integers(100, 300))
def test_mffd_packs_every_item_once_within_capacity(sizes: list[int], capacity: int) -> None:
    arr = np.array(sizes, dtype=np.int64)
    bins = mffd(arr, capacity)
    check_every_record_once(bins, len(sizes))
    assert all(arr[b].sum() <= capacity for b in bins)
    # MFFD's bound: at most 71/60 OPT + 1 bins, and OPT >= ceil(sum / capacity).
    assert len(bins) <= 71 / 60 * max(1, -(-arr.sum() // capacity)) * 2 + 1


def test_pooled_mffd_split_gives_every_rank_the_same_bin_count_and_loses_nothing() -> None:
    tok = lengths(3000)
    order = global_order(tok.size, 0, 0)
    pool = Pool(order, tok, 8, 8, 4)
    bins, left = pooled_mffd_split(pool, capacity=int(8 * tok.mean()) + 8192)
    assert len({len(b) for b in bins}) == 1
    check_every_record_once(bins, tok.size, left_out=left)


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 5), n=st.integers(1, 4), m=st.integers(1, 40), data=st.data())
def test_hold_back_emits_carry_in_and_new_records_exactly_once(
    rows: int, n: int, m: int, data
) -> None:
    from bcl_stream.planner.carry import hold_back

    hold = data.draw(st.integers(0, m))
    carry_in = hold if n > 1 else data.draw(st.integers(0, 5))
    costs = np.random.default_rng(m).exponential(size=rows * (n * m + carry_in))
    ids = np.arange(costs.size, dtype=np.int64).reshape(rows, -1)
    carried, new = ids[:, :carry_in], ids[:, carry_in:].reshape(rows, n, m)
    windows, out = hold_back(new, carried, costs, hold, target=float(costs.mean() * m))
    assert windows.shape == (rows, n, carry_in + m - hold) and out.shape == (rows, hold)
    for r in range(rows):
        check_every_record_once(windows[r], ids[r], left_out=out[r])


def test_carry_over_brings_rank_windows_closer_than_no_carry() -> None:
    tok = lengths(40000, seed=5)
    cost = tok.astype(float) ** 1.3

    def cv_ranks(carry: int) -> float:
        config = PlanConfig(world_size=8, pack_size=8, window=16, carry=carry, stratify=False)
        c = cost[plan(cost, config).packs].sum(axis=2)
        return float((c.std(axis=0) / c.mean(axis=0)).mean())

    assert cv_ranks(32) < 0.9 * cv_ranks(0)


def test_carry_must_be_smaller_than_the_window() -> None:
    with pytest.raises(ValueError, match="carry must be in"):
        PlanConfig(world_size=1, pack_size=2, window=2, carry=4)


@settings(max_examples=60, deadline=None)
@given(grid=grids(ranks=(2, 8), size=(1, 8), group=(1, 1), steps=(1, 8)), seed=SEEDS)
def test_step_fill_never_raises_the_sum_of_step_maxima(grid: Grid, seed: int) -> None:
    from bcl_stream.planner.step_fill import fill_steps

    group, steps, b = grid.ranks, grid.steps, grid.size  # fill_steps' group: the ranks of a step
    costs = np.random.default_rng(seed).pareto(1.2, size=(3, group * steps * b)) + 0.01
    first = partition(costs, group * steps, "lpt", 8)
    filled = fill_steps(costs, first, group, refine=8)

    def step_time(a: np.ndarray) -> np.ndarray:
        loads = np.take_along_axis(costs, a.reshape(3, -1), axis=1).reshape(a.shape).sum(axis=2)
        return (-np.sort(-loads, axis=1))[:, ::group].sum(axis=1)

    assert np.all(step_time(filled) <= step_time(first) + 1e-9)
    for w in range(3):
        check_every_record_once(filled[w], group * steps * b, what=f"window {w}")


def test_step_fill_lowers_step_time_on_a_heavy_tail() -> None:
    from bcl_stream.planner.step_fill import fill_steps

    costs = np.random.default_rng(7).pareto(1.1, size=(200, 8 * 16 * 8)) + 0.01  # G=8, W=16, B=8
    first = partition(costs, 8 * 16, "lpt", 8)
    filled = fill_steps(costs, first, group=8, refine=8)

    def step_time(a: np.ndarray) -> float:
        loads = np.take_along_axis(costs, a.reshape(200, -1), axis=1).reshape(a.shape).sum(axis=2)
        return float((-np.sort(-loads, axis=1))[:, ::8].sum())

    assert step_time(filled) < 0.995 * step_time(first)
