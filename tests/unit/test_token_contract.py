"""The token-budget contract's planner (``planner/token_contract.py``): the budget, equal
micro-batch counts per step and epoch, every record once or reported, no empty micro-batch,
determinism, windowed plans equal to the whole epoch's, and balance on cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bcl_stream.cost import resolve
from bcl_stream.planner import (
    PlanConfig,
    ShardTable,
    build_node_streams,
    build_token_streams,
    shard_weights,
)
from bcl_stream.planner.token_contract import (
    EMPTY,
    TAIL_STEP,
    TokenWalker,
    even_steps,
    mean_fed_tokens,
    micro_batches_per_window,
    pack_window,
    pack_window_padded,
    padded_room,
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
    streams = build_token_streams(costs, table, config, seed=seed, epoch=epoch, tokens=tokens)
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
    (1, 1, "rank", 1, "padded"),
    (4, 4, "rank", 2, "padded"),
    (4, 4, "node", 4, "padded"),
    (8, 2, "world", 4, "padded"),
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


def test_needs_a_budget():
    with pytest.raises(ValueError, match="needs max_tokens"):
        PlanConfig(world_size=2, contract="tokens")


def test_pack_window_padded_keeps_rows_times_longest_within_capacity():
    rng = np.random.default_rng(2)
    tok = np.minimum((rng.pareto(1.3, 400) * 60 + 8).astype(np.int64), 2048)
    cost = resolve("llama3-8b").cost(tok)
    where, load = pack_window_padded(np.arange(400), tok, cost, 24, 2048)
    placed = where >= 0
    assert set(where[placed].tolist()) == set(range(24))  # no bin empty
    rows = np.bincount(where[placed], minlength=24)
    longest = np.zeros(24, dtype=np.int64)
    np.maximum.at(longest, where[placed], tok[placed])
    assert (rows * longest).max() <= 2048
    priciest = np.zeros(24)
    np.maximum.at(priciest, where[placed], cost[placed])
    assert np.allclose(rows * priciest, load)  # padded cost: rows x costliest record
    # what is left out is the shortest: carried, it fits a later window first
    if (~placed).any():
        assert tok[~placed].max() <= tok[placed].min()
    # few long records: chunks are halved until every bin holds one
    few = np.full(30, 100, dtype=np.int64)
    where, _ = pack_window_padded(np.arange(30), few, few * 1.0, 24, 2048)
    assert (where >= 0).all() and np.bincount(where, minlength=24).min() >= 1


def test_the_padded_intake_counts_the_room_a_record_takes():
    tokens = np.full(1000, 1000)
    # 4 rows of 1,000 tokens in 4,096: each record takes 1,024 of the budget, a little more
    # where a window's last chunk is short
    assert 1024 <= padded_room(tokens, 4096, 16, 0.9) <= 1.1 * 1024
    tokens, _, _ = _corpus()
    wide = padded_room(tokens, T, 512, 0.95)
    narrow = padded_room(tokens, T, 8, 0.95)
    assert mean_fed_tokens(tokens, T) < wide < narrow  # fewer bins: farther neighbours


def test_few_steps_an_epoch_leave_no_step_in_the_tail():
    """With few steps per rank (a small epoch on many ranks) the partial step past the last
    whole one used to be the epoch's tail, up to a step per rank (12-15% of the records at
    64 x 8 on 1M records); the intake is evened so the epoch divides into whole steps."""
    tokens, costs, table = _corpus(30_000)
    config = PlanConfig(
        world_size=64, ranks_per_node=8, scope="world", grad_accum=4, contract="tokens",
        max_tokens=T, window=4,
    )  # fmt: skip
    aimed = token_geometry(config, tokens, table.counts.size)
    plain = build_node_streams(costs, table, aimed, seed=0, epoch=0, tokens=tokens)
    steps = len(plain.nodes[0]) / (plain.config.stream_ranks * aimed.pack_size)
    assert steps >= 1 and steps % 1 > 0.3  # the case: a large partial step
    _, packs, dropped, streams = _plan(config, tokens, costs, table)
    assert streams.n_packs == int(steps) + 1  # one more whole step
    assert streams.config.pack_size < aimed.pack_size  # each step reads a little less
    n = streams.n_packs
    assert streams.config.pack_size >= (n - 1 + TAIL_STEP) / n * aimed.pack_size - 1
    tail = sum(streams.tail(n).size for n in range(len(streams.nodes)))
    per_step = streams.config.stream_ranks * streams.config.pack_size
    assert tail < streams.config.stream_ranks * streams.n_packs  # under a record a rank-step
    assert tail < 0.1 * per_step
    tokens_valid = packs != EMPTY
    assert _loads(packs, tokens).max() <= T and tokens_valid.sum(axis=2).min() >= 1
    left = {
        "epoch_tail": np.concatenate([streams.tail(n) for n in range(len(streams.nodes))]),
        "over_token_budget": dropped,
        "too_long": np.flatnonzero(tokens > T),
    }
    check_every_record_once(packs[tokens_valid], tokens.size, left)


def test_even_steps_keeps_the_geometry_where_a_step_would_read_too_little():
    config = PlanConfig(world_size=8, contract="tokens", max_tokens=T, grad_accum=4)
    geometry = token_geometry(config, np.full(100, 400))
    step = 8 * geometry.pack_size
    assert even_steps(geometry, 5 * step, 8) is geometry  # whole steps already
    assert even_steps(geometry, 5 * step + step // 10, 8) is geometry  # 5.1 steps: keep 5
    assert even_steps(geometry, 5 * step + step * 4 // 10, 8) is geometry  # 5.4: keep 5
    for tenths in (6, 9):  # 5.6 and 5.9 steps: six of 0.92 and 0.97 the intake
        evened = even_steps(geometry, 5 * step + step * tenths // 10, 8)
        assert evened.pack_size == (5 * step + step * tenths // 10) // (6 * 8)
    evened = even_steps(geometry, step * 6 // 10, 8)  # 0.6 of a step: one step, not none
    assert evened.pack_size == step * 6 // 10 // 8
    few = replace(geometry, pack_size=14)  # 139.5 steps of 14 records: 13 a step would read
    assert even_steps(few, 8 * (139 * 14 + 7), 8) is few  # 150 steps, not 140


def test_evened_streams_pass_over_the_records_once(monkeypatch):
    """Where evening moves the intake the streams are built twice; the memory cap's pass over
    every record (``KeepFilter.kept_table``) is the same for both and is made once (at 10^8
    records it was a second full pass of the set-up), and the streams are those a fresh build
    at the evened geometry gives."""
    from bcl_stream.planner.shard_table import KeepFilter

    tokens, costs, table = _corpus(30_000)
    config = PlanConfig(
        world_size=64, ranks_per_node=8, scope="world", grad_accum=4, contract="tokens",
        max_tokens=T, window=4,
    )  # fmt: skip
    calls = []
    kept_table = KeepFilter.kept_table
    monkeypatch.setattr(
        KeepFilter, "kept_table", lambda self, *a: calls.append(1) or kept_table(self, *a)
    )
    streams = build_token_streams(costs, table, config, seed=0, epoch=0, tokens=tokens)
    aimed = token_geometry(config, tokens, table.counts.size)
    assert streams.config.pack_size < aimed.pack_size  # the case: evening moved the intake
    assert len(calls) == 1
    fresh = build_node_streams(
        costs, table, replace(aimed, pack_size=streams.config.pack_size), seed=0, epoch=0,
        tokens=tokens,
    )  # fmt: skip
    assert fresh.n_packs == streams.n_packs
    for a, b in zip(fresh.nodes, streams.nodes, strict=True):
        assert np.array_equal(a.take(np.arange(len(a))), b.take(np.arange(len(b))))


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 22])
def test_mean_fed_tokens_is_the_exact_mean_within_the_budget(monkeypatch, chunk):
    """Summed chunk by chunk in the stored dtype less the records over the budget: the same
    value as the mean of the kept records, whatever the chunk and dtype."""
    import bcl_stream.planner.token_contract as tc

    monkeypatch.setattr(tc, "MEAN_CHUNK", chunk)
    rng = np.random.default_rng(1)
    for dtype in (np.int32, np.int64, np.uint16):
        tokens = rng.integers(1, 9000, 5000).astype(dtype)
        kept = tokens[tokens <= T].astype(np.int64)
        assert mean_fed_tokens(tokens, T) == kept.sum() / kept.size
    assert mean_fed_tokens(np.full(10, T + 1, np.int32), T) == float(T)  # none kept


def test_keep_filter_span_equals_the_filter_on_the_id_range():
    """``KeepFilter.span`` (the memory cap's pass reads tokens as slices) keeps exactly what
    the filter keeps on the same ids, with and without a cap, exclusions and tokens."""
    from bcl_stream.planner.shard_table import KeepFilter

    rng = np.random.default_rng(2)
    tokens = rng.integers(1, 100, 1000).astype(np.int32)
    gone = rng.choice(1000, 40, replace=False)
    for keep in (
        KeepFilter(tokens, 50),
        KeepFilter(tokens, 50, gone),
        KeepFilter(None, None, gone),
        KeepFilter(tokens, None),
        KeepFilter(None, None),
    ):
        for lo, hi in ((0, 1000), (13, 14), (250, 731), (999, 1000)):
            ids = np.arange(lo, hi, dtype=np.int64)
            assert np.array_equal(keep.span(lo, hi), keep(ids))
