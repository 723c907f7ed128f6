"""Fuzzing the reader-state loader: random, truncated and corrupted states either load into a
cursor that replays correctly, or raise StateError — never another exception from deep inside
the planner, numpy or torch.

The loader under test is the whole resume path a checkpoint takes: ``parse_state`` (structure),
``resolve_state`` (fit to the data and config) and ``PackLoader.load_state_dict`` (fit to the
plan), then one ``iter()`` to prove an accepted state is really usable. The dataset is an
in-memory ``PlanDataset`` (no streaming import), so each example costs well under a millisecond.
"""

from __future__ import annotations

import copy
import json
import resource
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bcl_stream.cost import get_preset
from bcl_stream.epoch.cursor import parse_state
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import StateError
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.io.index import CostIndex, ShardEntry
from bcl_stream.loading.loader import PackLoader

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
CONFIG = ReaderConfig.build(world_size=2, pack_size=3, window=2, seed=5, shard_group=4)


@pytest.fixture(autouse=True, scope="module")
def _memory_guard() -> Iterator[None]:
    """Cap this process's address space while fuzzing: a state the loader wrongly accepts
    (say world_size=2**40) must fail as MemoryError here, not exhaust a shared machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        current = int(fh.read().split()[0]) * resource.getpagesize()
    cap = current + (2 << 30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class MemoryDataset(PlanDataset):
    """Yields record ids only: enough to check what a resumed loader replays."""

    def _read_packs(self, packs):  # type: ignore[no-untyped-def]
        for row in packs:
            yield [{"sample_id": int(s)} for s in row]


def make_index(n: int = 61, seed: int = 0) -> CostIndex:
    tokens = np.random.default_rng(seed).integers(1, 50, n)
    shards = [ShardEntry(f"s{i}", c) for i, c in enumerate([20, 20, n - 40])]
    return CostIndex.build(tokens, get_preset("tokens"), shards, "mds")


INDEX = make_index()


def fresh_loader(config: ReaderConfig = CONFIG, rank: int = 0) -> PackLoader:
    return PackLoader(MemoryDataset(INDEX, config, rank))


def saved_state(consumed: int = 2) -> dict[str, Any]:
    """A genuine state: ``consumed`` packs taken from epoch 0."""
    loader = fresh_loader()
    it = iter(loader)
    for _ in range(consumed):
        next(it)
    return loader.state_dict()


GOOD = saved_state()
CONFIG_KEYS = sorted(
    [(key,) for key in GOOD["config"]] + [("plan", key) for key in GOOD["config"]["plan"]]
)
"""Paths of the config's keys: top level and the nested planner fields."""


def _config_parent(state: dict[str, Any], key: tuple[str, ...]) -> Any:
    """The dict holding ``key``'s last element inside ``state["config"]`` (None: gone)."""
    parent: Any = state["config"]
    for part in key[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
    return parent if isinstance(parent, dict) and key[-1] in parent else None


def load_or_state_error(state: Any) -> None:
    """The property: either StateError, or a cursor whose replay is the plan's tail."""
    loader = fresh_loader()
    try:
        loader.load_state_dict(state)
    except StateError as exc:
        assert str(exc)  # a message, not an empty error
        return
    n = len(loader)
    epoch, consumed, segments = loader.epoch, loader.packs_consumed, loader._segments
    assert 0 <= consumed <= n
    # A state saved at the end of an epoch resumes at the next one; an epoch left without a
    # pack (an elastic resume after which no pack fits) stays the epoch, and yields nothing.
    if consumed and consumed == n:
        expected = loader.plan_dataset.epoch_plan(epoch + 1, ()).rank_packs(0)
    else:
        expected = loader.plan_dataset.epoch_plan(epoch, segments).rank_packs(0)[consumed:]
    got = [[s["sample_id"] for s in pack] for pack in loader]
    assert got == expected.tolist()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64])
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def test_genuine_state_round_trips() -> None:
    """The baseline the fuzzers perturb: a real state resumes exactly where it was saved."""
    loader = fresh_loader()
    loader.load_state_dict(copy.deepcopy(GOOD))
    assert loader.packs_consumed == 2
    got = [[s["sample_id"] for s in pack] for pack in loader]
    assert got == loader.plan_dataset.rank_packs()[2:].tolist()


@FUZZ
@given(value=json_values)
def test_random_values_as_state(value: Any) -> None:
    load_or_state_error(value)


@FUZZ
@given(
    key=st.sampled_from(sorted(GOOD)),
    value=json_values | st.integers(-3, 40),
)
def test_one_top_level_field_replaced(key: str, value: Any) -> None:
    state = copy.deepcopy(GOOD)
    state[key] = value
    load_or_state_error(state)


@FUZZ
@given(
    key=st.sampled_from(CONFIG_KEYS),
    value=json_values | st.integers(-3, 40) | st.sampled_from(["rank", "node", "world", "lpt"]),
)
# Ten ranks consumed 60 of the 61 records: the resumed epoch has no pack left.
@example(key=("plan", "world_size"), value=10)
def test_one_config_field_replaced(key: tuple[str, ...], value: Any) -> None:
    state = copy.deepcopy(GOOD)
    parent = _config_parent(state, key)
    assert parent is not None
    parent[key[-1]] = value
    load_or_state_error(state)


@FUZZ
@given(
    segments=st.lists(
        st.dictionaries(
            st.sampled_from(["world_size", "ranks_per_node", "packs_consumed", "other"]),
            st.integers(-2, 12) | json_values,
            max_size=4,
        )
        | json_values,
        max_size=3,
    )
)
def test_random_elastic_segments(segments: list[Any]) -> None:
    state = copy.deepcopy(GOOD)
    state["segments"] = segments
    load_or_state_error(state)


@FUZZ
@given(
    drop=st.sets(st.sampled_from(sorted(GOOD))),
    drop_cfg=st.sets(st.sampled_from(CONFIG_KEYS)),
)
def test_truncated_states_missing_keys(drop: set[str], drop_cfg: set[tuple[str, ...]]) -> None:
    """A state cut short (keys lost) is refused unless nothing essential went missing."""
    state = copy.deepcopy(GOOD)
    for key in drop:
        del state[key]
    if "config" in state:
        for key in sorted(drop_cfg, key=len, reverse=True):  # plan fields before "plan"
            parent = _config_parent(state, key)
            if parent is not None:
                del parent[key[-1]]
    load_or_state_error(state)


@FUZZ
@given(position=st.integers(0, 10_000), bit=st.integers(0, 6))
def test_flipped_bits_in_serialized_state(position: int, bit: int) -> None:
    """A checkpoint's JSON text with one bit flipped: if it still parses, load or refuse."""
    text = bytearray(json.dumps(GOOD).encode())
    text[position % len(text)] ^= 1 << bit
    try:
        state = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return  # not a state at all: the checkpoint reader's problem, covered elsewhere
    load_or_state_error(state)


@FUZZ
@given(cut=st.integers(0, 400))
def test_truncated_serialized_state(cut: int) -> None:
    """Every prefix of a state's JSON that still parses as JSON is loaded or refused."""
    text = json.dumps(GOOD)[:cut]
    for candidate in (text, text + "}", text + "}}", text + "]}", text + '"}'):
        try:
            state = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        load_or_state_error(state)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("fingerprint", "0" * 16, "other data"),
        ("version", 99, "version 99"),
        ("packs_consumed", 10_000, "packs consumed"),
        ("epoch", -1, "negative"),
    ],
)
def test_named_refusals(field: str, value: Any, match: str) -> None:
    """The refusals the fuzzers hit most, with the message a user sees."""
    state = copy.deepcopy(GOOD)
    state[field] = value
    with pytest.raises(StateError, match=match):
        fresh_loader().load_state_dict(state)


def test_state_from_another_configuration_is_named() -> None:
    state = copy.deepcopy(GOOD)
    state["config"]["plan"]["pack_size"] = 4
    with pytest.raises(StateError, match=r"pack_size=4 .* pack_size=3"):
        fresh_loader().load_state_dict(state)


def test_state_from_another_dataset_is_refused() -> None:
    other = PackLoader(MemoryDataset(make_index(seed=1), CONFIG, 0))
    with pytest.raises(StateError, match="saved on other data"):
        other.load_state_dict(copy.deepcopy(GOOD))


def test_parse_state_structure_only() -> None:
    cursor = parse_state(copy.deepcopy(GOOD))
    assert (cursor.epoch, cursor.packs_consumed) == (0, 2)


BOUNDARY_INTS = (
    st.sampled_from([-1, 0, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64]) | st.integers()
)


@FUZZ
@given(
    path=st.sampled_from(
        [("epoch",), ("packs_consumed",), ("version",)]
        + [
            ("config", k)
            for k in ("seed", "world_size", "pack_size", "window", "shard_group", "carry")
        ]
    ),
    value=BOUNDARY_INTS,
)
def test_integer_fields_at_machine_boundaries(path: tuple[str, ...], value: int) -> None:
    """Integers past int64 must be refused by the loader, not overflow later in ``iter()``."""
    state = copy.deepcopy(GOOD)
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    load_or_state_error(state)


def _set(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    state = copy.deepcopy(GOOD)
    target: Any = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return state


def _segment(**fields: Any) -> list[dict[str, Any]]:
    return [{"world_size": 2, "ranks_per_node": 1, "packs_consumed": 1, **fields}]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("epoch",), 2**63),  # overflowed the shared cursor tensor in iter()
        (("config", "world_size"), True),  # a bool passed as an int: TypeError in the planner
        (("config", "world_size"), 2**31),  # planned 2**31 ranks: MemoryError
        (("segments",), _segment(world_size=True)),
        (("segments",), _segment(world_size=2**40)),
        (("segments",), _segment(world_size=[2])),  # unhashable in the plan cache key
        (("segments",), _segment(packs_consumed=None)),
        (("segments",), _segment(packs_consumed=1.5)),
        (("segments",), _segment(packs_consumed="1")),
        (("segments",), _segment(ranks_per_node={})),
    ],
    ids=repr,
)
def test_found_by_fuzzing(path: tuple[Any, ...], value: Any) -> None:
    """Each state here once escaped as TypeError/MemoryError/ValueError; all must be refused."""
    with pytest.raises(StateError):
        loader = fresh_loader()
        loader.load_state_dict(_set(path, value))
        list(loader)


@FUZZ
@given(values=st.fixed_dictionaries({key: json_values for key in sorted(GOOD)}))
def test_every_field_of_a_random_type(values: dict[str, Any]) -> None:
    """All keys present, each holding any JSON value: load or refuse, never crash."""
    load_or_state_error(values)


@FUZZ
@given(
    extra=st.dictionaries(
        st.sampled_from(["carry", "rank", "buffer", "segments_v3", "x"]), json_values, min_size=1
    )
)
def test_unknown_top_level_keys(extra: dict[str, Any]) -> None:
    """A state with keys this release does not write (say a carry from a later release) either
    resumes exactly (the keys are ignored: the cursor replays the same plan) or is refused."""
    load_or_state_error({**copy.deepcopy(GOOD), **extra})


@FUZZ
@given(consumed=st.integers(0, 12), cut=st.integers(0, 600), close=st.sampled_from(["", "}", "}}"]))
def test_states_saved_anywhere_then_truncated(consumed: int, cut: int, close: str) -> None:
    """A state saved after any number of packs (epoch end included), its JSON cut short."""
    loader = fresh_loader()
    n = len(loader)
    it = iter(loader)
    for _ in range(min(consumed, n)):
        next(it)
    text = json.dumps(loader.state_dict())
    try:
        state = json.loads(text[:cut] + close)
    except json.JSONDecodeError:
        return
    load_or_state_error(state)
