"""What the plan knows of what is trained: records longer than max_seq_len at their truncated
cost and token count, trained counts after the cut where the index can give them, step totals,
and which normalization applies (plan or all-reduce), with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from bcl_stream.cost import get_preset
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.loss_tokens import StepTokens, normalization, step_tokens
from bcl_stream.epoch.plan import ReaderConfig, Segment, costs_and_table
from bcl_stream.epoch.truncation import fed_costs, fed_tokens, fed_trained, truncation
from bcl_stream.io.index import CostIndex, ShardEntry

TOKENS = np.array([5, 40, 12, 100, 7, 64, 3, 90], dtype=np.uint32)
# every token trained, none past 0, part, part, all, all, all, all
TRAINED = np.array([4, 39, 6, 50, 6, 63, 2, 89], dtype=np.uint32)


def make_index(trained: np.ndarray = TRAINED, n_copies: int = 1) -> CostIndex:
    tokens = np.tile(TOKENS, n_copies)
    shards = [ShardEntry(f"s{i}", 8) for i in range(n_copies)]
    return CostIndex.build(
        tokens, get_preset("llama3-8b"), shards, "mds", trained=np.tile(trained, n_copies)
    )


def test_truncation_counts_records_and_tokens_cut() -> None:
    index = make_index()
    report = truncation(index, 50)
    assert (report.records, report.tokens) == (3, (100 - 50) + (64 - 50) + (90 - 50))
    assert report.unknown_trained == 1  # the 100-token record trains 50 of its 99 targets
    assert "3 records longer are truncated (104 tokens cut)" in report.describe()
    assert truncation(index, 100).records == 0
    assert truncation(index, None).describe().startswith("no max_seq_len")


def test_fed_costs_and_tokens_are_those_of_the_truncated_records() -> None:
    index = make_index()
    model = get_preset("llama3-8b")
    costs = fed_costs(index, [None], index.costs(), 50)
    want = model.cost(np.minimum(TOKENS, 50)).astype(np.float32)
    np.testing.assert_allclose(costs, want, rtol=1e-6)
    assert fed_tokens(index, 50).tolist() == np.minimum(TOKENS, 50).tolist()
    stored = index.costs()
    assert fed_costs(index, [None], stored, None) is stored  # nothing cut: no copy
    # the planner reads the truncated costs
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2, max_seq_len=50)
    planned, _ = costs_and_table(index, config)
    np.testing.assert_allclose(planned, want, rtol=1e-6)


def test_trained_after_the_cut_where_the_index_can_give_it() -> None:
    fully = TRAINED.copy()
    fully[3] = 99  # the 100-token record now trains every target
    index = make_index(fully)
    got = fed_trained(index, 50)
    assert got is not None
    want = fully.copy()
    want[[1]] = 39  # 40 <= 50: not cut
    want[[3, 5, 7]] = 49  # cut to 50 tokens, every target trained: 49
    assert np.asarray(got).tolist() == want.tolist()
    assert fed_trained(make_index(), 50) is None  # a partial mask past the cut: unknown


@pytest.mark.parametrize(
    ("world", "per_node", "scope", "expected"),
    [
        (1, 1, "rank", "plan"),
        (4, 4, "node", "plan"),
        (4, 4, "world", "plan"),
        (4, 4, "rank", "all_reduce"),
        (8, 4, "node", "all_reduce"),
        # planner v4: scope world joins the two nodes into one row of 8 ranks (too few shards
        # for a row per node), so one row spans the world
        (8, 4, "world", "plan"),
    ],
)
def test_normalization_follows_the_planning_rows(
    world: int, per_node: int, scope: str, expected: str
) -> None:
    config = ReaderConfig.build(
        world_size=world, ranks_per_node=per_node, pack_size=2, window=2, scope=scope
    )
    got, why = normalization(make_index(n_copies=4), config)
    assert got == expected
    assert why


def test_a_partial_mask_past_the_cut_falls_back_to_rescaling() -> None:
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2, max_seq_len=50)
    got, why = normalization(make_index(), config)
    assert got == "rescale" and "1 records longer than max_seq_len=50" in why
    assert step_tokens(make_index(), config) is None


def test_canonical_ranks_take_the_count_from_the_labels() -> None:
    # a physical rank's optimizer step is several canonical ranks' packs: the readers' per-step
    # counts would follow the canonical grad_accum, not the trainer's, so none is attached
    config = ReaderConfig.build(
        world_size=2, ranks_per_node=2, pack_size=2, window=2, grad_accum=2, canonical_ranks=4
    )
    got, why = normalization(make_index(n_copies=8), config)
    assert got == "rescale" and "canonical_ranks=4" in why
    assert step_tokens(make_index(n_copies=8), config) is None


def test_own_rows_attach_the_ranks_own_step_counts() -> None:
    index = make_index(n_copies=8)
    config = ReaderConfig.build(
        world_size=2, ranks_per_node=2, pack_size=2, window=2, scope="rank", grad_accum=2
    )
    steps = step_tokens(index, config)
    assert steps is not None and not steps.world and steps.key == "rank_step_loss_tokens"


def test_step_totals_sum_every_rank_and_micro_batch_of_each_step() -> None:
    trained = np.arange(100, dtype=np.int64)
    steps = StepTokens(trained, grad_accum=2)
    group = np.arange(2 * 5 * 3).reshape(2, 5, 3)  # 2 ranks, 5 packs, B = 3
    per_pack = trained[group].sum(axis=(0, 2))
    want = [per_pack[0:2].sum()] * 2 + [per_pack[2:4].sum()] * 2 + [per_pack[4]]
    assert steps.totals(group).tolist() == want


def test_step_totals_of_a_plan_match_its_packs() -> None:
    index = make_index(n_copies=8)
    config = ReaderConfig.build(
        world_size=2, ranks_per_node=2, pack_size=2, window=2, scope="node", grad_accum=2
    )
    steps = step_tokens(index, config)
    assert steps is not None
    packs = full_plan(index, config, 0).plan.packs  # (ranks, n, B)
    totals = steps.totals(packs)
    for k in range(0, packs.shape[1], 2):
        want = int(TRAINED[packs[:, k : k + 2] % 8].sum())
        assert totals[k] == totals[min(k + 1, packs.shape[1] - 1)] == want
    # an elastic resume in mid-step: the new plan's steps do not line up, none is attached
    assert step_tokens(index, config, (Segment(4, 4, 3),)) is None
    assert step_tokens(index, config, (Segment(4, 4, 2),)) is not None


def test_reader_config_records_max_seq_len_only_when_set() -> None:
    plain = ReaderConfig.build(world_size=1, pack_size=2, window=2)
    assert "max_seq_len" not in plain.to_dict()
    cut = ReaderConfig.build(world_size=1, pack_size=2, window=2, max_seq_len=64)
    assert ReaderConfig.from_dict(cut.to_dict()) == cut
    assert ReaderConfig.from_dict(plain.to_dict()).max_seq_len is None
    with pytest.raises(ValueError, match="max_seq_len must be an integer >= 1"):
        ReaderConfig.build(world_size=1, pack_size=2, window=2, max_seq_len=0)


def test_a_mixtures_step_totals_come_from_each_streams_counts() -> None:
    from bcl_stream.epoch.mixture_index import MixtureIndex, StreamSpec

    first, second = make_index(n_copies=4), make_index(TRAINED // 2, n_copies=2)
    mixture = MixtureIndex(
        [StreamSpec("a", proportion=0.6), StreamSpec("b", proportion=0.4)], [first, second]
    )
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2, grad_accum=2)
    assert normalization(mixture, config)[0] == "plan"
    steps = step_tokens(mixture, config)
    assert steps is not None
    packs = full_plan(mixture, config, 0).plan.packs
    stream, local = mixture.locate(packs)
    by_stream = [first.trained, second.trained]
    counts = np.vectorize(lambda s, i: int(by_stream[s][i]))(stream, local)
    totals = steps.totals(packs)
    for k in range(0, packs.shape[1], 2):
        assert totals[k] == int(counts[:, k : k + 2].sum())
