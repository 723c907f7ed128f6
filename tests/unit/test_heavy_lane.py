"""Planner v3 invariants: the heavy lane, the read budget, and scope world at the cost of one
node. Expectations are computed independently of the code under test (plain sorts and counts)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once
from plan_strategies import SEEDS, Grid, grids
from shard_tables import table_for

from bcl_stream.analysis.displacement import displacement_steps
from bcl_stream.planner import PlanConfig, build_node_streams, plan_epoch, plan_windows
from bcl_stream.planner.heavy_lane import lane_order


def heavy_tailed(n: int, seed: int = 0) -> np.ndarray:
    """Pareto lengths in 'path order': runs of records with their own scale (real code)."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(rng.lognormal(0, 0.8, n // 200 + 1), 200)[:n]
    return np.minimum(40 * scale * (1 + rng.pareto(1.4, n)), 8192)


@settings(max_examples=60, deadline=None)
@given(
    grid=grids(ranks=(1, 4), size=(1, 4), group=(1, 5), steps=(1, 6)),
    lane=st.integers(2, 8),
    seed=SEEDS,
    streams=st.integers(1, 3),
)
def test_lane_order_moves_the_costliest_records_to_the_slots_and_keeps_the_rest(
    grid: Grid, lane: int, seed: int, streams: int
) -> None:
    rng = np.random.default_rng(seed)
    # the grid's group: packs per rank in a window; its steps: windows in the lane block
    ranks, size, window = grid.ranks, grid.size, grid.group
    windows = min(grid.steps, lane)  # a lane block holds at most ``lane`` windows
    chunk = window * size * ranks
    n = windows * chunk
    ids = rng.permutation(10 * n)[:n]
    costs = rng.pareto(1.2, n).round(1)  # rounded: ties, broken by id
    labels = rng.integers(0, streams, n) if streams > 1 else None
    out = lane_order(
        ids, costs, labels, window=window, pack_size=size, ranks_per_node=ranks, lane=lane
    )
    check_every_record_once(out, ids)  # a permutation: nothing lost
    count = window * ranks * windows // lane
    if labels is None:
        # rare outliers only: above 1.5x the record at rank 2*count of the block
        if count:
            level = np.sort(costs)[max(n - 2 * count, 0)]
            count = int((np.sort(costs)[::-1][:count] > 1.5 * level).sum())
        top = ids[np.lexsort((ids, -costs))[:count]]
        # the slots (count <= W*P: all in the block's first window): the first record of pack
        # j of rank r's slice, for j < W, round robin over the ranks
        slot = [r * window * size + j for j in range(window) for r in range(ranks)][:count]
        assert out[slot].tolist() == top.tolist()  # heaviest first
        rest = ids[~np.isin(ids, top)]
        assert out[np.setdiff1d(np.arange(n), slot)].tolist() == rest.tolist()
    else:
        # every position keeps its stream: each window's stream counts are exactly the same
        where = {int(i): int(s) for i, s in zip(ids, labels, strict=True)}
        assert [where[int(i)] for i in out] == labels.tolist()


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize("lane", [0, 2, 8])
def test_plans_with_the_lane_yield_every_record_once_in_packs_of_b(scope: str, lane: int) -> None:
    costs = heavy_tailed(40_000)
    table = table_for(costs, 1000)
    config = PlanConfig(
        world_size=8, ranks_per_node=4, pack_size=4, window=4, scope=scope, lane=lane
    )
    plan = plan_epoch(costs, table, config, seed=3, epoch=1)
    assert plan.packs.shape == (8, plan.n_packs, 4)  # exactly B, equal pack counts
    check_every_record_once(plan.packs, costs.size, left_out=plan.remainder)
    again = plan_epoch(costs, table, config, seed=3, epoch=1)
    assert np.array_equal(plan.packs, again.packs)  # a pure function of (data, config, seed)


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
def test_displacement_is_zero_without_the_lane_and_bounded_by_its_horizon(scope: str) -> None:
    costs = heavy_tailed(60_000, seed=1)
    table = table_for(costs, 1000)
    for lane in (0, 4):
        config = PlanConfig(
            world_size=8, ranks_per_node=4, pack_size=4, window=4, scope=scope, lane=lane
        )
        plan = plan_epoch(costs, table, config)
        streams = build_node_streams(costs, table, config, seed=0, epoch=0)
        mean, most = displacement_steps(plan.packs, streams)
        if lane == 0:
            assert (mean, most) == (0.0, 0)
        else:
            assert 0 < most <= (lane - 1) * config.window
            assert mean < 1.0


def test_each_blocks_heaviest_records_run_in_its_first_window_on_every_node() -> None:
    costs = heavy_tailed(64_000, seed=2)
    table = table_for(costs, 1000)
    lane, window = 4, 4
    config = PlanConfig(
        world_size=8, ranks_per_node=4, pack_size=4, window=window, scope="node", lane=lane
    )
    plan = plan_epoch(costs, table, config)
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    chunk = window * 4 * 4
    span = lane * chunk
    for node in range(2):
        packs = plan.packs[node * 4 : node * 4 + 4]
        for b in range(plan.n_packs // (lane * window)):
            block = streams.nodes[node].take(np.arange(b * span, (b + 1) * span))  # no lane
            c = np.sort(costs[block])
            bar = max(1.5 * c[c.size - 2 * window * 4], 0.5 * 4 * costs.mean())
            top = block[np.lexsort((block, -costs[block]))[: window * 4]]
            top = top[costs[top] > bar]  # the rare outliers: the lane's records
            assert top.size > 0
            first = packs[:, b * lane * window : b * lane * window + window]
            assert np.isin(top, first).all()
            # one per pack: the W*P heaviest never share a pack
            per_pack = np.isin(first, top).sum(axis=2)
            assert per_pack.max() == 1


def test_scope_world_plans_one_node_without_touching_the_others() -> None:
    costs = heavy_tailed(48_000, seed=4)
    table = table_for(costs, 500)
    config = PlanConfig(
        world_size=12,
        ranks_per_node=3,
        pack_size=4,
        window=4,
        scope="world",
        world_row=3,
        shard_group=8,  # 24 shards a node: rows of one node (wider: test_world_rows.py)
    )
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    batch = plan_windows(streams, costs, None, [2], 0, streams.n_windows)
    whole = plan_epoch(costs, table, config)
    assert np.array_equal(batch.packs, whole.packs[6:9])  # the same packs as the world plan
    assert [bool(n._cache) for n in streams.nodes] == [False, False, True, False]
    assert [n._groups is not None for n in streams.nodes] == [False, False, True, False]


@pytest.mark.parametrize(("scope", "lane"), [("rank", 3), ("node", 2), ("node", 8)])
def test_a_reader_resuming_inside_a_lane_block_gets_the_uninterrupted_packs(
    scope: str, lane: int
) -> None:
    costs = heavy_tailed(30_000, seed=5)
    table = table_for(costs, 700)
    config = PlanConfig(
        world_size=4, ranks_per_node=2, pack_size=4, window=3, scope=scope, lane=lane
    )
    whole = plan_epoch(costs, table, config)
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    rows, ranks = ([1], [1]) if scope == "rank" else ([0], [0, 1])
    for first in (1, lane + 1, streams.n_windows - 1):  # inside the first, second, last block
        batch = plan_windows(streams, costs, None, rows, first, streams.n_windows)
        assert np.array_equal(batch.packs, whole.packs[ranks, batch.first_pack :])
