"""Mixtures: stream weights, the per-epoch draw, one plan over the mixture, resume checks."""

from __future__ import annotations

import numpy as np
import pytest
from pack_oracles import check_every_record_once

from bcl_stream.cost import get_preset
from bcl_stream.epoch.cursor import Cursor, resolve_state
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.mixture_index import MixtureIndex, SegmentArray, StreamSpec, mixture_changes
from bcl_stream.epoch.plan import ReaderConfig, ReaderPlan
from bcl_stream.epoch.stream_report import stream_report
from bcl_stream.errors import StateError
from bcl_stream.io.index import CostIndex, ShardEntry
from bcl_stream.planner import PlanConfig, plan_epoch
from bcl_stream.planner.mixture import MixtureLayout, choose_counts
from bcl_stream.process_layout import ProcessLayout

NONE4 = [None] * 4


def test_choose_counts_follow_streaming_semantics() -> None:
    got = choose_counts([100, 100, 100], proportion=[2, 1, 1], repeat=[None] * 3, choose=[None] * 3)
    assert got == [150, 75, 75]  # epoch = all records once, split by normalized proportions
    got = choose_counts([10, 20], proportion=[1, 2], repeat=[None, None], choose=[None, None],
                        epoch_size=7)  # fmt: skip
    assert sum(got) == 7
    assert choose_counts([10, 20], proportion=[None, None], repeat=[1.5, None],
                         choose=[None, 3]) == [15, 3]  # fmt: skip
    with pytest.raises(ValueError, match="cannot be mixed"):
        choose_counts([10, 20], proportion=[0.5, None], repeat=[None, 2], choose=[None, None])
    with pytest.raises(ValueError, match="at most one"):
        choose_counts([10], proportion=[0.5], repeat=[2], choose=[None])
    with pytest.raises(ValueError, match="only applies to proportions"):
        choose_counts([10], proportion=[None], repeat=[None], choose=[None], epoch_size=5)


def test_stream_spec_parsing() -> None:
    assert StreamSpec.parse("s3://bucket/x") == StreamSpec("s3://bucket/x")
    spec = StreamSpec.parse("s3://bucket/code:proportion=0.3,cost_model=llama3-8b")
    assert (spec.path, spec.proportion, spec.cost_model) == ("s3://bucket/code", 0.3, "llama3-8b")
    assert StreamSpec.parse("data/a:choose=10").choose == 10
    assert StreamSpec.of({"path": "d", "repeat": 2}).repeat == 2
    with pytest.raises(ValueError, match="not key=value"):
        StreamSpec.parse("data/a:weight=2")
    with pytest.raises(ValueError, match="at most one"):
        StreamSpec.parse("data/a:repeat=2,choose=3")
    with pytest.raises(ValueError, match="> 0"):
        StreamSpec.parse("data/a:proportion=0")


def layout(counts: list[list[int]], choose: list[int]) -> MixtureLayout:
    return MixtureLayout.build([np.array(c) for c in counts], choose)


@pytest.mark.parametrize("choose", [[50, 30], [130, 10], [200, 61]])
def test_sample_counts_are_closed_form_and_exact(choose: list[int]) -> None:
    lay = layout([[20, 30, 0, 50], [17, 23, 21]], choose)
    for epoch in range(6):
        draw = lay.draw(3, epoch)
        mask = draw(np.arange(lay.n_records))
        per_shard = np.add.reduceat(mask, np.r_[0, np.cumsum(lay.table_counts)[:-1]])
        per_shard[lay.table_counts == 0] = 0
        assert np.array_equal(per_shard, draw.usable)
        shards = np.array([4, 3])  # an epoch's count is choose give or take one per shard
        assert np.all(np.abs(draw.per_stream() - np.array(choose)) <= shards)
        again = lay.draw(3, epoch)(np.arange(lay.n_records))
        assert np.array_equal(mask, again)  # a pure function of (seed, epoch)


def test_draws_cycle_through_every_record_before_repeating() -> None:
    lay = layout([[40, 25, 35]], [30])  # 30 of 100 records an epoch
    seen = np.zeros(100, dtype=np.int64)
    for epoch in range(10):  # 300 draws: every record exactly 3 times
        seen += lay.draw(0, epoch)(np.arange(100))
        assert seen.max() - seen.min() <= 1  # never a second draw before every first one
    assert set(seen.tolist()) == {3}
    assert not np.array_equal(lay.draw(0, 0)(np.arange(100)), lay.draw(0, 1)(np.arange(100)))


def test_segment_array_gathers_like_the_concatenation() -> None:
    lay = layout([[3, 4], [5]], [14, 2])  # stream 0 twice, stream 1 once
    parts = [np.arange(7) * 10.0, np.arange(5) + 0.5]
    view = SegmentArray(lay, parts)
    flat = np.concatenate([parts[0], parts[0], parts[1]])
    assert view.shape == (19,) and len(view) == 19
    assert np.array_equal(view[:], flat)
    assert np.array_equal(view[3:16], flat[3:16])
    ids = np.array([[0, 18], [7, 13]])
    assert np.array_equal(view[ids], flat[ids])
    assert view[15] == flat[15]


def index_of(lengths: np.ndarray, shard: int) -> CostIndex:
    n = lengths.size
    shards = [ShardEntry(f"s{i}", min(shard, n - i)) for i in range(0, n, shard)]
    return CostIndex.build(lengths, get_preset("tokens"), shards, "mds")


def mixture(epoch_size: int | None = None) -> MixtureIndex:
    rng = np.random.default_rng(0)
    sources = [
        np.sort(rng.lognormal(4, 0.6, 3000).astype(np.int64) + 1),  # sorted, as real data is
        rng.lognormal(5, 0.4, 2000).astype(np.int64) + 1,
        np.sort(rng.lognormal(3, 0.3, 1500).astype(np.int64) + 1),
    ]
    specs = [StreamSpec("a", proportion=0.5), StreamSpec("b", proportion=0.3),
             StreamSpec("c", proportion=0.2, cost_model="llama3-8b")]  # fmt: skip
    return MixtureIndex(specs, [index_of(s, 256) for s in sources], epoch_size=epoch_size)


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
def test_plan_holds_the_proportions_in_every_window_and_every_record_once(scope: str) -> None:
    index = mixture()
    config = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=8, window=8, scope=scope)
    plan = full_plan(index, config, 1)
    draw = index.draw(0, 1)
    planned = np.concatenate([plan.plan.packs.ravel(), *plan.plan.remainder.values()])
    assert np.unique(planned).size == planned.size  # each mixture id at most once
    assert np.array_equal(np.sort(planned), np.flatnonzero(draw(np.arange(len(index)))))
    want = index.layout.choose / index.layout.choose.sum()
    streams = index.locate(plan.plan.packs)[0]
    window = config.plan.window
    for k in range(plan.n_packs // window):
        got = np.bincount(streams[:, k * window : (k + 1) * window].ravel(), minlength=3)
        assert np.abs(got / got.sum() - want).max() <= 0.02
    report = stream_report(index, config, plan)
    assert report is not None and [s["path"] for s in report] == ["a", "b", "c"]
    for s, c in zip(report, draw.per_stream(), strict=True):
        assert s["records_drawn"] == c
        assert s["records_used"] + sum(s["records_left"].values()) == c


def test_reader_plan_equals_the_whole_epoch_plan() -> None:
    index = mixture()
    config = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=4, window=4)
    whole = full_plan(index, config, 2)
    lazy = ReaderPlan(index, config, 2)
    assert lazy.n_packs == whole.n_packs
    assert lazy.remainder_counts() == whole.remainder_counts()
    for rank in range(4):
        assert np.array_equal(lazy.rank_packs(rank), whole.rank_packs(rank))


def test_stream_cost_models_apply_per_stream() -> None:
    index = mixture()
    costs = index.costs()
    stream, local = index.locate(np.arange(len(index)))
    third = np.flatnonzero(stream == 2)[:5]
    expected = get_preset("llama3-8b").cost(index.indexes[2].tokens[local[third]])
    assert np.allclose(costs[third], expected)
    first = np.flatnonzero(stream == 0)[:5]
    assert np.allclose(costs[first], index.indexes[0].costs()[local[first]])


def cursor_of(index: MixtureIndex, config: ReaderConfig) -> dict[str, object]:
    return Cursor(3, 5, index.fingerprint(), config, (), tuple(index.describe())).to_dict()


def test_a_changed_mixture_is_refused_or_restarts_the_epoch() -> None:
    config = ReaderConfig.build(world_size=2, pack_size=4, window=4)
    old, new = mixture(), mixture(epoch_size=5000)
    state = cursor_of(old, config)
    same = resolve_state(state, fingerprint=old.fingerprint(), config=config,
                         mixture=old.describe())  # fmt: skip
    assert (same.epoch, same.packs_consumed) == (3, 5)
    with pytest.raises(StateError, match="epoch_size") as err:
        resolve_state(state, fingerprint=new.fingerprint(), config=config, mixture=new.describe())
    assert "restart_epoch" in str(err.value)
    restarted = resolve_state(state, fingerprint=new.fingerprint(), config=config,
                              mixture=new.describe(), on_mixture_change="restart_epoch")  # fmt: skip
    assert (restarted.epoch, restarted.packs_consumed) == (3, 0)
    with pytest.raises(StateError, match="one dataset"):
        resolve_state(state, fingerprint="x", config=config, mixture=None)


def test_mixture_changes_name_what_changed() -> None:
    a = [{"path": "x", "proportion": 0.5, "fingerprint": "1"}, {"path": "y", "proportion": 0.5}]
    b = [{"path": "x", "proportion": 0.6, "fingerprint": "2"}, {"path": "z", "proportion": 0.4}]
    changes = " | ".join(mixture_changes(a, b))
    for word in ("stream y removed", "stream z added", "proportion 0.5 -> 0.6", "data"):
        assert word in changes


def test_version_2_states_are_refused_with_what_to_do() -> None:
    config = ReaderConfig.build(world_size=2, pack_size=4, window=4)
    state = Cursor(1, 2, "fp", config).to_dict()
    state["version"] = 2
    with pytest.raises(StateError, match="drop the data loader's state"):
        resolve_state(state, fingerprint="fp", config=config)


def test_elastic_resume_of_a_mixture_reads_the_rest_of_the_draw_once() -> None:
    """4 ranks consume 5 packs each, then 2 ranks re-plan the rest: every drawn id once, over
    the two segments and the remainder, and every pack under the memory cap."""
    from bcl_stream.epoch.plan import Segment

    index = mixture()
    old = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=4, window=4, max_tokens=2000)
    new = old.resized(ProcessLayout(world_size=2, ranks_per_node=2))
    first = ReaderPlan(index, old, 1)
    taken = np.concatenate([first.rank_packs(r)[:5].ravel() for r in range(4)])
    plan = full_plan(index, new, 1, (Segment(4, 2, 5),))
    assert np.array_equal(np.sort(plan.consumed), np.sort(taken))
    drawn = np.flatnonzero(index.draw(0, 1)(np.arange(len(index))))
    check_every_record_once([taken, plan.plan.packs], drawn, left_out=plan.plan.remainder)
    assert np.asarray(index.tokens[plan.plan.packs]).sum(axis=-1).max() <= 2000
    lazy = ReaderPlan(index, new, 1, (Segment(4, 2, 5),))
    assert lazy.remainder_counts() == plan.remainder_counts()


def test_a_repeated_stream_keeps_each_shard_on_one_node() -> None:
    """Copies of a shard follow its first copy: a stream read 2.5x per epoch is still
    downloaded once, by one node (no shard of any stream reaches two nodes)."""
    index = mixture()
    lay = MixtureLayout.build([ix.shard_counts for ix in index.indexes], [7500, 1500, 1000])
    assert lay.copies.tolist() == [3, 1, 1]
    costs = SegmentArray(lay, [ix.costs() for ix in index.indexes])
    table = lay.table([np.ones(len(ix.shard_counts)) for ix in index.indexes])
    config = PlanConfig(
        world_size=4, ranks_per_node=2, pack_size=4, window=4, split_shards=0.0,
        max_amplification=1.0,
    )  # fmt: skip
    plan = plan_epoch(costs, table, config, seed=2, epoch=1, draw=lay.draw(2, 1))
    nodes: list[set[tuple[int, int]]] = []
    for node in range(2):
        ids = plan.packs[node * 2 : node * 2 + 2].ravel()
        stream, local = lay.locate(ids)
        shard = local // 256  # every stream's shards hold 256 records (the last fewer)
        nodes.append(set(zip(stream.tolist(), shard.tolist(), strict=True)))
    assert not nodes[0] & nodes[1]
    drawn = np.bincount(lay.locate(plan.packs.ravel())[0], minlength=3) / plan.packs.size
    assert np.abs(drawn - lay.choose / lay.choose.sum()).max() < 0.02
