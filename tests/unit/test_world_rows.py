"""Planner v4: scope ``world`` plans rows of several nodes where a node holds few
data-parallel ranks (tensor parallelism). Expectations are computed independently of the code
under test: hand-worked row widths, plain set and count checks (``pack_oracles``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pack_oracles import balance_efficiency, check_epoch
from shard_tables import table_for

from bcl_stream.analysis.displacement import displacement_steps
from bcl_stream.planner import PlanConfig, build_node_streams, plan_epoch, plan_windows


def layout(nodes: int, per_node: int, scope: str = "world", **knobs: Any) -> PlanConfig:
    """``nodes`` x ``per_node`` ranks, packs of 4 records, ``scope`` world unless said."""
    return PlanConfig(
        world_size=nodes * per_node, ranks_per_node=per_node, pack_size=4, scope=scope, **knobs
    )


def ordered_heavy(n: int, seed: int = 0) -> np.ndarray:
    """Costs in 'write order': runs of 300 records with their own scale, a Pareto tail."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(rng.lognormal(0, 1.0, n // 300 + 1), 300)[:n]
    return np.minimum(30 * scale * (1 + rng.pareto(1.5, n)), 6000.0)


@pytest.mark.parametrize(
    ("nodes", "per_node", "world_row", "budget", "scope", "row_nodes"),
    [
        (8, 1, 8, 16.0, "world", 8),  # TP=8 on 8 nodes: one row of 8
        (64, 1, 8, 16.0, "world", 8),  # 8 rows of 8 nodes
        (16, 2, 8, 16.0, "world", 4),  # TP=4: rows of 4 nodes, 8 ranks
        (4, 8, 8, 16.0, "world", 1),  # a node of 8 is a row already
        (6, 1, 8, 16.0, "world", 6),  # no divisor of 6 reaches 8: the whole world
        (3, 2, 8, 16.0, "world", 3),  # divisors 1, 3: the whole world
        (12, 1, 8, 4.0, "world", 4),  # the read budget caps the row at 4 nodes
        (8, 1, 8, 1.0, "world", 1),  # no budget: a row is a node
        (8, 1, 1, 16.0, "world", 1),  # world_row 1: a row is a node
        (8, 1, 8, 16.0, "node", 1),  # scope node never spans nodes
        (8, 1, 8, 16.0, "rank", 1),
    ],
)
def test_row_width(
    nodes: int, per_node: int, world_row: int, budget: float, scope: str, row_nodes: int
) -> None:
    config = layout(nodes, per_node, scope, window=2, world_row=world_row, max_amplification=budget)
    assert config.row_nodes == row_nodes
    assert config.n_rows * config.row_ranks == config.world_size
    if scope == "world":
        assert config.row_ranks == per_node * row_nodes


@pytest.mark.parametrize(
    ("nodes", "per_node", "shards", "budget", "row_nodes"),
    [
        (64, 8, 244, 16.0, 16),  # 1M records of 4096: 4 shards a node; rows of 128 shards
        (64, 8, 8192, 16.0, 1),  # 128 shards a node: locality
        (64, 8, 4096, 16.0, 2),  # 64 a node: pairs of nodes hold two groups
        (128, 8, 244, 4.0, 4),  # the read budget caps the row
        (64, 1, 100_000, 16.0, 8),  # plenty of data: the ranks rule alone
        (16, 2, 244, 16.0, 16),  # both rules: the wider one
    ],
)
def test_rows_widen_where_nodes_hold_little_data(
    nodes: int, per_node: int, shards: int, budget: float, row_nodes: int
) -> None:
    config = layout(nodes, per_node, window=2, max_amplification=budget)
    planned = config.rows_for(shards)
    assert planned.row_nodes == row_nodes
    assert planned.rows_for(shards) == planned  # resolving twice changes nothing
    assert PlanConfig(**{**_fields(config), "scope": "node"}).rows_for(shards).row_nodes == 1


def _fields(config: PlanConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in PlanConfig.__dataclass_fields__}


LAYOUTS = [(8, 1), (6, 1), (4, 2), (12, 1)]


@pytest.mark.parametrize(("nodes", "per_node"), LAYOUTS)
@pytest.mark.parametrize("lane", [0, 8])
def test_world_rows_yield_every_record_once_in_exact_packs(
    nodes: int, per_node: int, lane: int
) -> None:
    costs = ordered_heavy(40_000, seed=nodes)
    table = table_for(costs, 400)
    config = layout(nodes, per_node, window=4, lane=lane, shard_group=8)
    plan = plan_epoch(costs, table, config, seed=3)
    left = sum(ids.size for ids in plan.remainder.values())
    check_epoch(plan.packs.tolist(), costs.size, 4, left)
    assert plan.packs.shape[0] == config.world_size  # every rank the same pack count
    again = plan_epoch(costs, table, config, seed=3)
    assert np.array_equal(plan.packs, again.packs)  # a pure function: every process agrees


@pytest.mark.parametrize(("nodes", "per_node"), LAYOUTS)
def test_a_row_reads_only_its_own_shards(nodes: int, per_node: int) -> None:
    """The nodes of a row read the row's shards (amplification = its width); distinct rows
    read disjoint shards (no cut here: every stream holds two groups or more)."""
    costs = ordered_heavy(48_000, seed=1)
    table = table_for(costs, 250)  # 192 shards
    config = layout(nodes, per_node, window=4, shard_group=4, split_shards=0.0)
    plan = plan_epoch(costs, table, config, seed=2)
    config = build_node_streams(costs, table, config, seed=2, epoch=0).config  # rows planned
    shard_of = np.searchsorted(np.cumsum(table.counts), plan.packs, side="right")
    row_shards = [
        set(np.unique(shard_of[r * config.row_ranks : (r + 1) * config.row_ranks]).tolist())
        for r in range(config.n_rows)
    ]
    for a in range(len(row_shards)):
        for b in range(a + 1, len(row_shards)):
            assert not row_shards[a] & row_shards[b]
    reads = sum(
        len(set(np.unique(shard_of[n * per_node : (n + 1) * per_node]).tolist()))
        for n in range(nodes)
    )
    distinct = len(set().union(*row_shards))
    assert reads / distinct <= config.row_nodes


@pytest.mark.parametrize(("nodes", "per_node", "carry"), [(8, 1, 0), (12, 1, 3), (4, 2, 0)])
def test_a_reader_plans_its_row_alone_and_resumes_anywhere(
    nodes: int, per_node: int, carry: int
) -> None:
    """A reader plans only its own row (the other streams stay untouched) and, resuming at
    any window, gets the uninterrupted packs."""
    costs = ordered_heavy(36_000, seed=7)
    table = table_for(costs, 300)
    config = layout(
        nodes, per_node, window=3, carry=carry, carry_span=4, lane=4, world_row=4,
        shard_group=4,  # 120 shards: every row of 4 ranks holds two groups
    )  # fmt: skip
    whole = plan_epoch(costs, table, config)
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    config = streams.config  # the rows planned
    assert config.n_rows > 1
    row = config.n_rows - 1
    ranks = np.arange(row * config.row_ranks, (row + 1) * config.row_ranks)
    for first in (0, 1, 5, streams.n_windows - 1):
        batch = plan_windows(streams, costs, None, [row], first, streams.n_windows)
        assert np.array_equal(batch.packs, whole.packs[ranks, batch.first_pack :])
    touched = [n._groups is not None for n in streams.nodes]
    assert touched == [i == row for i in range(config.n_rows)]


@pytest.mark.parametrize(("nodes", "per_node"), [(8, 1), (16, 2)])
def test_world_balances_nodes_of_few_ranks_better_than_node_scope(
    nodes: int, per_node: int
) -> None:
    costs = ordered_heavy(200_000, seed=11)
    table = table_for(costs, 1000)
    base = {"world_size": nodes * per_node, "ranks_per_node": per_node, "pack_size": 8}
    world = plan_epoch(costs, table, PlanConfig(**base, window=8, scope="world"))
    node = plan_epoch(costs, table, PlanConfig(**base, window=8, scope="node"))
    e_world = balance_efficiency(world.packs.tolist(), costs)
    e_node = balance_efficiency(node.packs.tolist(), costs)
    assert e_world > e_node + 0.02, (e_world, e_node)


def test_displacement_is_measured_against_the_row_stream() -> None:
    costs = ordered_heavy(30_000, seed=5)
    table = table_for(costs, 300)
    config = PlanConfig(world_size=8, ranks_per_node=1, pack_size=4, window=3, scope="world")
    streams = build_node_streams(costs, table, config, seed=0, epoch=0)
    plan = plan_epoch(costs, table, config)
    mean, most = displacement_steps(plan.packs, streams)
    assert 0.0 <= mean <= most <= (config.lane - 1) * config.window
