"""The token-budget contract's planner (``planner/token_contract.py``): the budget, equal
micro-batch counts per step and epoch, every record once or reported, no empty micro-batch,
determinism, windowed plans equal to the whole epoch's, and balance on cost."""

from __future__ import annotations

import numpy as np
import pytest

from bcl_stream.cost import resolve
from bcl_stream.planner import (
    PlanConfig,
    ShardTable,
    build_node_streams,
    shard_weights,
    token_contract,
)
from bcl_stream.planner.token_contract import (
    EMPTY,
    TokenWalker,
    micro_batches_per_window,
    pack_window,
    plan_tokens,
    token_geometry,
)
from tests.pack_oracles import check_every_record_once

T = 4096


def _corpus(n: int = 30_000, seed: int = 0, sorted_by_length: bool = False):
    rng = np.random.default_rng(seed)
    tokens = np.minimum((rng.pareto(1.3, n) * 60 + 8).astype(np.int64), 6000)
    if sorted_by_length:  # data written in order: the heavy records together
        tokens = np.sort(tokens)
    costs = resolve("llama3-8b").cost(tokens)
    counts = np.full(n // 500, 500)
    counts[-1] += n - counts.sum()
    return tokens, costs, ShardTable.build(counts, weight=shard_weights(counts, costs))


def _plan(config: PlanConfig, tokens, costs, table, seed: int = 0, epoch: int = 0):
    geometry = token_geometry(config, tokens)
    streams = build_node_streams(costs, table, geometry, seed=seed, epoch=epoch, tokens=tokens)
    walker = TokenWalker(streams, costs, tokens, config)
    packs, dropped = plan_tokens(walker)
    return walker, packs, dropped, streams


def _loads(packs, values):
    valid = packs != EMPTY
    return np.where(valid, values[np.where(valid, packs, 0)], 0).sum(axis=2)


LAYOUTS = [
    # (world, ranks per node, scope, grad_accum, layout)
    (1, 1, "rank", 1, "packed"),
    (4, 4, "rank", 2, "packed"),
    (4, 4, "node", 4, "packed"),
    (8, 2, "world", 4, "packed"),
    (8, 1, "world", 2, "packed"),
    (4, 2, "node", 3, "packed"),
    (8, 8, "node", 4, "packed"),  # 64 bins a window: the wide rows' fill (FILL)
]


@pytest.mark.parametrize(("world", "per_node", "scope", "g", "layout"), LAYOUTS)
@pytest.mark.parametrize("sorted_by_length", [False, True])
def test_budget_counts_and_every_record_once(world, per_node, scope, g, layout, sorted_by_length):
    tokens, costs, table = _corpus(sorted_by_length=sorted_by_length)
    tokens[7] = T + 1  # one record over the budget: reported, never planned
    config = PlanConfig(
        world_size=world, ranks_per_node=per_node, scope=scope, grad_accum=g, window=8,
        contract="tokens", max_tokens=T, layout=layout,
    )  # fmt: skip
    walker, packs, dropped, streams = _plan(config, tokens, costs, table)
    valid = packs != EMPTY
    # equal counts: every rank the same number of micro-batches, a whole number of steps
    assert packs.shape[0] == world and packs.shape[1] == walker.n_packs > 0
    assert walker.n_packs % g == 0
    assert micro_batches_per_window(config) % g == 0
    # no empty micro-batch, padding only at the end of a row
    n_rec = valid.sum(axis=2)
    assert n_rec.min() >= 1
    assert (np.sort(~valid, axis=2, kind="stable") == ~valid).all()
    # the budget
    if layout == "packed":
        assert _loads(packs, tokens).max() <= T
    else:
        longest = np.where(valid, tokens[np.where(valid, packs, 0)], 0).max(axis=2)
        assert (n_rec * longest).max() <= T
    # every record once, or reported with its reason
    tail = np.concatenate([streams.tail(n) for n in range(len(streams.nodes))])
    too_long = np.flatnonzero(tokens > T)
    assert 7 in too_long
    left = {"epoch_tail": tail, "over_token_budget": dropped, "too_long": too_long}
    check_every_record_once(packs[valid], tokens.size, left)
    assert dropped.size <= 0.01 * tokens.size


def test_fill_and_balance_on_cost():
    tokens, costs, table = _corpus(60_000)
    config = PlanConfig(
        world_size=8, ranks_per_node=8, scope="node", grad_accum=4, contract="tokens",
        max_tokens=T,
    )  # fmt: skip
    _, packs, dropped, _ = _plan(config, tokens, costs, table)
    fill = _loads(packs, tokens).mean() / T
    cost = _loads(packs, costs)
    efficiency = cost.mean(axis=0).sum() / cost.max(axis=0).sum()
    assert fill > 0.85, fill
    assert efficiency > 0.97, efficiency
    assert dropped.size == 0


def test_deterministic_and_seed_dependent():
    tokens, costs, table = _corpus()
    config = PlanConfig(world_size=4, ranks_per_node=2, contract="tokens", max_tokens=T)
    a = _plan(config, tokens, costs, table, seed=3)[1]
    b = _plan(config, tokens, costs, table, seed=3)[1]
    c = _plan(config, tokens, costs, table, seed=4)[1]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("scope", ["rank", "node"])
def test_windowed_walk_equals_the_whole_epoch(scope):
    """A reader planning its own row from any window (the carry replayed from its chain's
    start) yields what the whole-epoch plan holds for it."""
    tokens, costs, table = _corpus(20_000)
    config = PlanConfig(
        world_size=4, ranks_per_node=2, scope=scope, contract="tokens", max_tokens=T, window=4,
        carry_span=3,
    )  # fmt: skip
    walker, whole, _, streams = _plan(config, tokens, costs, table)
    per_window = micro_batches_per_window(config)
    assert walker.window_micro_batches(walker.n_windows - 1) < per_window  # a short last one
    group = streams.config.row_ranks
    for row in range(streams.n_rows):
        for first in (0, 2, 4):
            got = [b.packs for b in walker.walk([row], first)]
            joined = [
                p[p != EMPTY].tolist()
                for b in got
                for rank in [b]
                for p in rank.reshape(-1, rank.shape[2])
            ]
            want_ranks = range(row * group, row * group + group)
            want = [
                whole[r, t][whole[r, t] != EMPTY].tolist()
                for k in range(first, walker.n_windows)
                for r in want_ranks
                for t in range(k * per_window, k * per_window + walker.window_micro_batches(k))
            ]
            assert joined == want


def test_pack_window_never_leaves_a_bin_empty_and_respects_capacity():
    rng = np.random.default_rng(1)
    tok = rng.integers(1, 900, 300)
    cost = resolve("llama3-8b").cost(tok)
    where, load = pack_window(np.arange(300), tok, cost, 24, 2048)
    placed = where >= 0
    assert set(where[placed].tolist()) == set(range(24))
    per_bin = np.bincount(where[placed], weights=tok[placed], minlength=24)
    assert per_bin.max() <= 2048
    assert np.allclose(np.bincount(where[placed], weights=cost[placed], minlength=24), load)


def test_needs_a_budget_and_the_packed_layout():
    with pytest.raises(ValueError, match="needs max_tokens"):
        PlanConfig(world_size=2, contract="tokens")
    with pytest.raises(ValueError, match="packed layout only"):
        PlanConfig(world_size=2, contract="tokens", max_tokens=T, layout="padded")


def test_the_fill_follows_the_bins_a_row_packs() -> None:
    from bcl_stream.planner.token_contract import FILL, FILL_NARROW, fill

    node = PlanConfig(world_size=8, ranks_per_node=8, contract="tokens", max_tokens=T)
    assert fill(node) == fill(node, 64) == FILL  # 16 micro-batches x 8 ranks
    rank = PlanConfig(world_size=8, ranks_per_node=8, scope="rank", contract="tokens", max_tokens=T)
    assert fill(rank) == FILL_NARROW  # 16 bins a window
    world = PlanConfig(
        world_size=8, ranks_per_node=1, scope="world", contract="tokens", max_tokens=T
    )
    assert fill(world) == FILL_NARROW  # a node alone holds one rank
    assert world.rows_for(64).row_ranks == 8
    assert fill(world, 64) == FILL  # scope world plans the 8 nodes as one row


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_the_mean_fed_length_read_in_chunks_is_numpys_mean(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The geometry's mean is read in chunks (an index is never copied whole); the value must
    be the whole-array mean the geometry was defined with, over records within the budget."""
    monkeypatch.setattr(token_contract, "MEAN_CHUNK", chunk)
    rng = np.random.default_rng(3)
    tok = np.minimum(rng.lognormal(6.0, 1.4, 1001).astype(np.int32) + 1, 30_000)
    kept = tok[tok <= 4096].astype(np.int64)
    assert token_contract.mean_fed_tokens(tok, 4096) == float(kept.mean())
    assert token_contract.mean_fed_tokens(np.array([9000], dtype=np.int32), 4096) == 4096.0
