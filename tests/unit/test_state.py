"""Reader state: structure, validation messages, and elastic re-planning (pure, no I/O)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from bcl_stream.cost import get_preset
from bcl_stream.epoch.cursor import STATE_VERSION, Cursor, parse_state, resolve_state
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import REASON_CONSUMED, ReaderConfig, ReaderPlan, Segment
from bcl_stream.errors import StateError
from bcl_stream.io.index import CostIndex, ShardEntry
from bcl_stream.process_layout import ProcessLayout


def make_index(n: int = 500, shard: int = 60, seed: int = 0) -> CostIndex:
    rng = np.random.default_rng(seed)
    tokens = np.clip(rng.lognormal(3, 1, n).astype(np.int64), 1, 4000)
    shards = [ShardEntry(f"s{i}", min(shard, n - i * shard)) for i in range(-(-n // shard))]
    return CostIndex.build(tokens, get_preset("tokens"), shards, "mds")


CONFIG = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=4, window=3, seed=7)


def state(**changes: object) -> dict[str, object]:
    base = Cursor(1, 5, "abc", CONFIG).to_dict()
    base.update(changes)
    return json.loads(json.dumps(base))


def test_round_trip_through_json() -> None:
    cursor = Cursor(2, 9, "f" * 16, CONFIG, (Segment(8, 4, 3),))
    assert parse_state(json.loads(json.dumps(cursor.to_dict()))) == cursor
    assert cursor.to_dict()["version"] == STATE_VERSION


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"version": 99}, "version 99 is not supported"),
        ({"version": 1}, "version 1 was written by planner v1.*start the epoch over"),
        ({"version": 3}, "version 3 was written by planner v2.*start the epoch over"),
        ({"version": 4}, "version 4 was written by planner v3.*start the epoch over"),
        ({"epoch": -1}, "negative epoch"),
        ({"packs_consumed": "3"}, "'packs_consumed' must be int"),
        ({"fingerprint": None}, "'fingerprint' must be str"),
        ({"config": {"world_size": 4}}, "invalid config"),
        ({"segments": [{"world_size": 2}]}, "invalid config or segment"),
    ],
)
def test_malformed_states_are_refused(changes: dict[str, object], match: str) -> None:
    with pytest.raises(StateError, match=match):
        parse_state(state(**changes))


@pytest.mark.parametrize("version", [7, 8, 9])
def test_versions_7_to_9_read_as_before_unless_their_plan_was_two_term(version: int) -> None:
    """Versions 8 (windows regrouped), 9 (windows redealt) and 10 (window swaps) changed
    image-text plans under a two-term cost model only: an older state of a text config resumes; one naming a two-term
    model is refused, since its position in the old plan cannot be replayed."""
    assert parse_state(state(version=version)) == parse_state(state())
    two_term = ReaderConfig.build(**{**CONFIG.flat(), "cost_model": "qwen2-vl-2b"})
    old = json.loads(json.dumps({**Cursor(1, 5, "abc", two_term).to_dict(), "version": version}))
    with pytest.raises(
        StateError, match=rf"version {version} was written under the two-term.*epoch over"
    ):
        parse_state(old)
    assert parse_state({**old, "version": STATE_VERSION}).config == two_term


def test_missing_key_and_non_dict() -> None:
    broken = state()
    del broken["epoch"]
    with pytest.raises(StateError, match="no 'epoch'"):
        parse_state(broken)
    with pytest.raises(StateError, match="must be a dict"):
        parse_state([1, 2])


def test_other_data_is_refused_naming_both_fingerprints() -> None:
    with pytest.raises(StateError, match="fingerprint abc, this dataset xyz"):
        resolve_state(state(), fingerprint="xyz", config=CONFIG)


@pytest.mark.parametrize(
    ("field", "value"),
    [("pack_size", 8), ("seed", 8), ("window", 2), ("scope", "world"), ("max_tokens", 100)],
)
def test_config_mismatch_names_the_field(field: str, value: object) -> None:
    other = ReaderConfig.build(**{**CONFIG.flat(), field: value})
    with pytest.raises(StateError, match=rf"saved with {field}=.* loader has {field}="):
        resolve_state(state(), fingerprint="abc", config=other)


def test_same_layout_resumes_the_cursor() -> None:
    cursor = resolve_state(state(), fingerprint="abc", config=CONFIG)
    assert (cursor.epoch, cursor.packs_consumed, cursor.segments) == (1, 5, ())


def test_resize_appends_a_segment_or_refuses() -> None:
    bigger = CONFIG.resized(ProcessLayout(world_size=6, ranks_per_node=2))
    cursor = resolve_state(state(), fingerprint="abc", config=bigger)
    assert cursor.segments == (Segment(4, 2, 5),)
    assert (cursor.epoch, cursor.packs_consumed, cursor.config) == (1, 0, bigger)
    with pytest.raises(StateError, match="world_size 4 -> 6"):
        resolve_state(state(), fingerprint="abc", config=bigger, allow_resize=False)


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize(("old_world", "new_world", "consumed"), [(4, 2, 5), (2, 6, 0), (4, 6, 9)])
def test_elastic_plan_yields_every_record_once(
    scope: str, old_world: int, new_world: int, consumed: int
) -> None:
    index = make_index()
    old = ReaderConfig.build(
        world_size=old_world, ranks_per_node=2, pack_size=4, window=3, scope=scope
    )
    new = old.resized(ProcessLayout(world_size=new_world, ranks_per_node=2))
    first = full_plan(index, old, 3)
    resumed = full_plan(index, new, 3, (Segment(old_world, 2, consumed),))
    taken = first.plan.packs[:, :consumed].ravel()
    assert np.array_equal(np.sort(resumed.consumed), np.sort(taken))
    left = np.concatenate(list(resumed.plan.remainder.values()))
    seen = np.concatenate([taken, resumed.plan.packs.ravel(), left])
    assert np.array_equal(np.sort(seen), np.arange(len(index)))
    assert resumed.remainder_counts().get(REASON_CONSUMED, 0) == taken.size
    assert resumed.plan.packs.shape[0] == new_world


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize("carry", [0, 2])
def test_first_packs_are_the_ranks_first_packs(scope: str, carry: int) -> None:
    """Elastic resume plans only the consumed windows: they must be the plan's own packs."""
    config = replace(CONFIG, plan=replace(CONFIG.plan, scope=scope, carry=carry, carry_span=2))
    plan = ReaderPlan(make_index(), config, 2)
    whole = np.stack([plan.rank_packs(r) for r in range(4)])
    for k in (0, 1, 3, 4, plan.n_packs):
        assert np.array_equal(plan.first_packs(k), whole[:, :k])
    with pytest.raises(ValueError, match="segment consumed"):
        plan.first_packs(plan.n_packs + 1)


def test_segments_chain() -> None:
    index = make_index()
    cfg = CONFIG.resized(ProcessLayout(world_size=2, ranks_per_node=2))
    segs = (Segment(4, 2, 4), Segment(6, 2, 2))
    plan = full_plan(index, cfg, 0, segs)
    left = np.concatenate(list(plan.plan.remainder.values()))
    seen = np.concatenate([plan.consumed, plan.plan.packs.ravel(), left])
    assert np.array_equal(np.sort(seen), np.arange(len(index)))
    assert plan.consumed.size == 4 * 4 * 4 + 6 * 2 * 4


def test_segment_past_its_plan_is_an_error() -> None:
    with pytest.raises(ValueError, match="segment consumed 999 packs"):
        full_plan(make_index(), CONFIG, 0, (Segment(2, 2, 999),))


def test_epochs_reshuffle_and_cache_returns_the_same_plan() -> None:
    index = make_index()
    a, b = full_plan(index, CONFIG, 0), full_plan(index, CONFIG, 1)
    assert not np.array_equal(a.plan.packs, b.plan.packs)
    assert full_plan(index, CONFIG, 0) is a  # cached: computed once per epoch per process


def test_reader_config_checks() -> None:
    with pytest.raises(ValueError, match="seed must be"):
        ReaderConfig.build(world_size=2, pack_size=2, window=2, seed=-1)
    with pytest.raises(ValueError, match="ranks_per_node=3 does not divide"):
        ReaderConfig.build(world_size=4, ranks_per_node=3, pack_size=2, window=2)
    with pytest.raises(ValueError, match="unknown keys"):
        ReaderConfig.from_dict({**CONFIG.to_dict(), "bogus": 1})
