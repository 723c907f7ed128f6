"""Planner v2 invariants: node-local shards, interleaved ranks, the stratified shuffle, windowed
plans equal to the whole-epoch plan, the sync-step rank order and the end-of-epoch drain."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once
from shard_tables import table_for

from bcl_stream.planner import (
    PlanConfig,
    ShardTable,
    build_node_streams,
    plan_epoch,
    plan_windows,
    shard_weights,
)
from bcl_stream.planner.carry import hold_back
from bcl_stream.planner.cuts import cut_shards
from bcl_stream.planner.dealing import balanced_deal, deal_shards
from bcl_stream.planner.node_streams import NodeStream
from bcl_stream.planner.rng import Tag, epoch_rng
from bcl_stream.planner.shard_table import KeepFilter
from bcl_stream.planner.stratify import stratified_permutation


def corpus(n: int, seed: int = 0, *, ordered: bool = True) -> np.ndarray:
    tok = np.minimum(np.random.default_rng(seed).lognormal(5.5, 1.1, n).astype(np.int64) + 1, 8192)
    return np.sort(tok) if ordered else tok


@settings(max_examples=80, deadline=None)
@given(
    shards=st.integers(0, 60),
    nodes=st.integers(1, 6),
    seed=st.integers(0, 999),
    shuffle=st.booleans(),
)
def test_every_shard_goes_to_exactly_one_node(
    shards: int, nodes: int, seed: int, shuffle: bool
) -> None:
    counts = np.random.default_rng(seed).integers(0, 50, shards)
    table = ShardTable.build(counts, weight=np.random.default_rng(seed).exponential(size=shards))
    dealt = deal_shards(table, nodes, seed, 0, shuffle=shuffle)
    assert len(dealt) == nodes
    check_every_record_once(dealt, shards)  # every shard to one node
    if shuffle and shards:
        sizes = [d.size for d in dealt]
        assert max(sizes) - min(sizes) <= 1  # one shard per node per row


def test_balanced_deal_evens_totals_and_varies_with_the_epoch() -> None:
    totals = np.random.default_rng(0).pareto(1.5, 400)
    owners = [balanced_deal(totals, 8, epoch_rng(0, e, Tag.NODE_DEAL)) for e in range(3)]
    for owner in owners:
        sums = np.bincount(owner, weights=totals, minlength=8)
        assert sums.max() - sums.min() <= totals.max() + 1e-9
        assert np.ptp(np.bincount(owner, minlength=8)) <= 1
    assert not np.array_equal(owners[0], owners[1])


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 3000), unit=st.integers(1, 200), seed=st.integers(0, 999))
def test_stratified_permutation_is_a_permutation(n: int, unit: int, seed: int) -> None:
    ids = np.arange(n, dtype=np.int64) * 3 + 7
    costs = np.random.default_rng(seed).pareto(1.2, n)
    out = stratified_permutation(ids, costs, unit, np.random.default_rng(seed))
    check_every_record_once(out, ids)


def test_stratified_units_carry_equal_cost() -> None:
    n, unit = 64 * 100, 64
    costs = np.random.default_rng(1).lognormal(0.0, 1.0, n)
    ids = np.arange(n, dtype=np.int64)
    strat = stratified_permutation(ids, costs, unit, np.random.default_rng(2))
    plain = np.random.default_rng(2).permutation(ids)
    spread = [costs[o].reshape(-1, unit).sum(axis=1).std() for o in (strat, plain)]
    assert spread[0] < 0.5 * spread[1]  # what is left is the top stratum's own spread


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2000),
    shard=st.integers(1, 300),
    nodes=st.integers(2, 9),
    amplification=st.sampled_from([1.0, 2.0, 16.0]),
    group=st.sampled_from([1, 4, 64]),
)
def test_cut_shards_keep_every_record_and_deal_pieces_to_distinct_nodes(
    n: int, shard: int, nodes: int, amplification: float, group: int
) -> None:
    costs = corpus(n).astype(float) ** 1.5
    table = table_for(costs, shard)
    cut = cut_shards(
        table, nodes, shard_group=group, split_shards=0.05, max_amplification=amplification
    )
    assert cut.counts.sum() == n
    dealt = deal_shards(cut, nodes, 0, 0)
    owner = np.empty(cut.counts.size, dtype=np.int64)
    for k, d in enumerate(dealt):
        owner[d] = k
    reads = cut.counts.size
    if cut.split is not None:
        pieces = cut.split[cut.split >= 0]
        per_shard = np.bincount(pieces)[np.unique(pieces)]
        assert per_shard.min() >= 2 and per_shard.max() <= nodes
        for shard_id in np.unique(pieces):
            mine = owner[cut.split == shard_id]
            assert np.unique(mine).size == mine.size  # each piece on another node
    distinct = table.counts.size
    if distinct >= 2 * nodes:  # enough shards that no cut is forced
        assert reads / distinct <= max(amplification, 1.0) + 1e-9


def test_read_policy_follows_data_per_node() -> None:
    """Two shard groups per node or more: locality (amplification <= 1 + split_shards); fewer:
    every shard cut into a team of pieces, within max_amplification."""
    costs = np.random.default_rng(0).lognormal(5, 1, 64 * 100)
    table = table_for(costs, 100)  # 64 shards
    wide = cut_shards(table, 8, shard_group=64, split_shards=0.05, max_amplification=4.0)
    assert wide.counts.size / 64 == pytest.approx(4.0)  # 8 shards per node -> teams of 4
    local = cut_shards(table, 8, shard_group=4, split_shards=0.05, max_amplification=4.0)
    assert local.counts.size / 64 <= 1.05
    capped = cut_shards(table, 8, shard_group=64, split_shards=0.05, max_amplification=1.0)
    assert capped.counts.size == 64


def test_lumps_are_cut_until_no_piece_exceeds_a_node_share() -> None:
    costs = np.ones(16 * 1000)
    costs[-1000:] = 200.0  # the last shard holds most of the epoch's cost
    table = table_for(costs, 1000)
    cut = cut_shards(table, 16, shard_group=64, split_shards=0.05, max_amplification=16.0)
    assert cut.split is not None
    pieces = cut.split == 15
    assert pieces.sum() == 16  # one piece per node: the lump is spread over the world
    dealt = deal_shards(cut, 16, 0, 0)
    cost = [float((cut.weight * cut.usable)[d].sum()) for d in dealt]
    assert max(cost) / min(cost) < 1.5


def test_a_node_with_no_shard_of_its_own_still_gets_records() -> None:
    costs = np.ones(100)
    config = PlanConfig(world_size=3, pack_size=8, window=2)
    plan = plan_epoch(costs, table_for(costs, 100), config)
    assert plan.n_packs == 4


def nodes_of_three(nodes: int, scope: str, **knobs: Any) -> PlanConfig:
    """``nodes`` nodes of 3 ranks each, packs of 4 records, planned at ``scope``."""
    return PlanConfig(world_size=3 * nodes, ranks_per_node=3, pack_size=4, scope=scope, **knobs)


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("split", [0.0, 0.05, 0.2])
def test_each_shard_is_read_by_one_node_but_for_the_cut_budget(
    scope: str, shuffle: bool, split: float
) -> None:
    tok = corpus(48_000, ordered=True)
    costs = tok.astype(float) ** 2  # sorted and quadratic: the last shards are lumps
    table = table_for(costs, 1500)  # 32 shards, 8 per node
    # 8 shards per node in groups of 4: two groups, so locality is kept; rows of one node
    # (rows of several: tests/unit/test_world_rows.py).
    config = nodes_of_three(4, scope, window=4, shuffle=shuffle, split_shards=split,
                            shard_group=4, world_row=3)  # fmt: skip
    plan = plan_epoch(costs, table, config, seed=5)
    shard_of = np.searchsorted(np.cumsum(table.counts), plan.packs, side="right")
    nodes_per_shard: dict[int, set[int]] = {}
    for rank in range(12):
        for s in np.unique(shard_of[rank]):
            nodes_per_shard.setdefault(int(s), set()).add(rank // 3)
    reads = sum(len(n) for n in nodes_per_shard.values())
    assert reads / len(nodes_per_shard) <= 1.0 + split  # download amplification
    if split == 0.0:
        assert all(len(n) == 1 for n in nodes_per_shard.values())


def test_ranks_of_a_node_read_the_same_region_at_the_same_time() -> None:
    """Scope rank (each rank its own planning row): window k of every rank of a node comes
    from the k-th chunk of the node's stream."""
    costs = np.arange(1.0, 8001.0)
    config = PlanConfig(
        world_size=4, ranks_per_node=4, pack_size=5, window=3, carry=0, lane=0, scope="rank"
    )
    streams = build_node_streams(costs, table_for(costs, 8000), config, seed=0, epoch=0)
    node = streams.nodes[0]
    chunk = config.window * config.pack_size * 4
    for rank in range(4):
        batch = plan_windows(streams, costs, None, [rank], 0, streams.n_windows)
        for k in range(streams.n_windows - 1):
            window = batch.packs[0, k * 3 : (k + 1) * 3].ravel()
            region = node.take(np.arange(k * chunk, (k + 1) * chunk))
            assert np.isin(window, region).all()


@settings(max_examples=40, deadline=None)
@given(
    scope=st.sampled_from(["rank", "node", "world"]),
    batch=st.integers(1, 5),
    carry=st.one_of(st.none(), st.integers(0, 20)),
    max_tokens=st.sampled_from([None, 12000]),
    seed=st.integers(0, 99),
    span=st.sampled_from([0, 1, 2, 3, 64]),
)
def test_windowed_plan_equals_the_whole_epoch_plan(
    scope: str, batch: int, carry: int | None, max_tokens: int | None, seed: int, span: int
) -> None:
    tok = corpus(6000, seed)
    costs = tok.astype(float) ** 1.3
    config = nodes_of_three(
        2, scope, window=6, carry=carry, max_tokens=max_tokens, grad_accum=2, carry_span=span
    )
    table = table_for(costs, 700)
    whole = plan_epoch(costs, table, config, seed=seed, tokens=tok).packs
    streams = build_node_streams(costs, table, config, seed=seed, epoch=0, tokens=tok)
    row_sets = (
        [np.arange(streams.n_rows)] if scope == "world" else [[r] for r in range(streams.n_rows)]
    )
    for rows in row_sets:
        pieces, state = [], None
        for start in range(0, streams.n_windows, batch):
            stop = min(start + batch, streams.n_windows)
            got = plan_windows(streams, costs, tok, rows, start, stop, state)
            pieces.append(got.packs)
            state = got.carry
        ranks = np.concatenate(
            [np.arange(r * config.row_ranks, (r + 1) * config.row_ranks) for r in rows]
        )
        assert np.array_equal(np.concatenate(pieces, axis=1), whole[ranks])
        # A resumed reader: any window, no carry given (replayed inside its carry span).
        k = seed % streams.n_windows
        resumed = plan_windows(streams, costs, tok, rows, k, streams.n_windows)
        assert np.array_equal(resumed.packs, whole[ranks][:, k * config.window :])


def test_group_order_is_a_pure_function_of_seed_and_epoch() -> None:
    costs = corpus(20_000).astype(float)
    table = table_for(costs, 250)
    shards = np.arange(table.counts.size)
    a = NodeStream(table, shards, group=4, seed=1, epoch=2, node=0, costs=costs, window_records=32)
    b = NodeStream(table, shards, group=4, seed=1, epoch=2, node=0, costs=costs, window_records=32)
    c = NodeStream(table, shards, group=4, seed=1, epoch=3, node=0, costs=costs, window_records=32)
    every = np.arange(len(a))
    assert np.array_equal(a.take(every), b.take(every))
    assert not np.array_equal(a.take(every), c.take(every))
    check_every_record_once(a.take(every), 20_000)


def test_grad_accum_balances_per_step_sums_without_changing_microbatches() -> None:
    tok = corpus(40_000, ordered=False)
    costs = tok.astype(float) ** 1.5
    table = table_for(costs, 4000)
    base = PlanConfig(world_size=8, ranks_per_node=8, pack_size=8, window=16, scope="node")
    one = plan_epoch(costs, table, base).packs
    four = plan_epoch(costs, table, PlanConfig(**{**_fields(base), "grad_accum": 4})).packs
    # Same packs in every micro-step, only handed to other ranks.
    for t in range(one.shape[1]):
        assert sorted(map(tuple, np.sort(one[:, t], axis=1))) == sorted(
            map(tuple, np.sort(four[:, t], axis=1))
        )

    def step_spread(packs: np.ndarray) -> float:
        c = costs[packs].sum(axis=2)
        steps = c[:, : c.shape[1] // 4 * 4].reshape(8, -1, 4).sum(axis=2)
        return float((steps.max(axis=0) / steps.mean(axis=0)).mean())

    assert step_spread(four) < step_spread(one)


def _fields(config: PlanConfig) -> dict:
    return {f: getattr(config, f) for f in PlanConfig.__slots__}


def test_the_window_before_the_last_keeps_the_drain_in_view() -> None:
    rng = np.random.default_rng(0)
    costs = rng.pareto(1.5, 4000) + 0.1
    ids = np.arange(4000, dtype=np.int64)
    new, carried = ids[:200].reshape(1, 1, 200), np.empty((1, 0), np.int64)
    last = ids[200:260]
    then = np.array([costs[last].sum()])
    target = float(costs.mean()) * 180
    then_target = float(costs.mean()) * (60 + 20)
    _, held = hold_back(new, carried, costs, 20, target, then=then, then_target=then_target)
    _, blind = hold_back(new, carried, costs, 20, target)
    miss = abs(costs[held].sum() + then[0] - then_target)
    miss_blind = abs(costs[blind].sum() + then[0] - then_target)
    assert miss <= miss_blind + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), max_size=25),
    chunk=st.integers(1, 70),
    seed=st.integers(0, 99),
)
def test_chunked_shard_passes_equal_the_direct_ones(
    counts: list[int], chunk: int, seed: int
) -> None:
    """Per-shard means and the memory cap's kept table, chunk by chunk, whatever the chunk."""
    import bcl_stream.planner.shard_table as order

    rng = np.random.default_rng(seed)
    n = sum(counts)
    costs, tokens = rng.random(n), rng.integers(1, 100, n)
    ends = np.cumsum(counts, dtype=np.int64)
    spans = list(zip(ends - np.asarray(counts, dtype=np.int64), ends, strict=True))
    keep = KeepFilter(tokens, 50, rng.choice(n, min(n, 3), replace=False) if n else None)
    kept = keep(np.arange(n, dtype=np.int64))
    old = order.PASS_RECORDS
    order.PASS_RECORDS = chunk
    try:
        means = shard_weights(counts, costs)
        table = keep.kept_table(ShardTable.build(counts), costs)
    finally:
        order.PASS_RECORDS = old
    assert np.allclose(means, [costs[a:b].mean() if b > a else 0.0 for a, b in spans])
    assert table.usable.tolist() == [int(kept[a:b].sum()) for a, b in spans]
    expected = [costs[a:b][kept[a:b]].mean() if kept[a:b].any() else 0.0 for a, b in spans]
    assert np.allclose(table.weight, expected)
    # Exclusions alone (elastic resume) are subtracted from the table's means, no pass.
    only = KeepFilter(None, None, rng.choice(n, min(n, 5), replace=False) if n else None)
    left = only(np.arange(n, dtype=np.int64))
    table = only.kept_table(ShardTable.build(counts, weight=means), costs)
    assert table.usable.tolist() == [int(left[a:b].sum()) for a, b in spans]
    expected = [costs[a:b][left[a:b]].mean() if left[a:b].any() else 0.0 for a, b in spans]
    assert np.allclose(table.weight, expected)
