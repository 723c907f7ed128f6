"""Fuzzing the reader-state loader: random, truncated and corrupted states are accepted or
refused (StateError, never another exception from deep inside the planner, numpy or torch)
as an independent oracle says, and an accepted state replays the uninterrupted run.

The loader under test is the whole resume path a checkpoint takes: ``parse_state`` (structure),
``resolve_state`` (fit to the data and config) and ``PackLoader.load_state_dict`` (fit to the
plan), then ``iter()`` to prove an accepted state is really usable. The dataset is an
in-memory ``PlanDataset`` (no streaming import), so each example costs well under a millisecond.

The oracle (:func:`verdict`) never asks the loader: it compares the mutated state with the
genuine one field by field and decides from what changed, to what, by the state's contract:
the six keys, a readable version, counts that are integers in range, the same fingerprint,
every config field equal to the loader's (a missing one reads as its declared default), a
changed world size an elastic resume the old plan must have room for. Where the contract
leaves the outcome open (a key this release does not write, an equal number of another JSON
type, elastic segments whose plans only the planner knows) either is allowed, and an accepted
state must still replay correctly. The expected replay comes from the state's own values and
the uninterrupted plans, never from the cursor the loader built.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import resource
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once

from bcl_stream.cost import get_preset
from bcl_stream.epoch.cursor import parse_state
from bcl_stream.epoch.plan import ReaderConfig, Segment
from bcl_stream.errors import StateError
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.io.index import CostIndex, ShardEntry
from bcl_stream.loading.loader import PackLoader
from bcl_stream.planner.checks import MAX_COUNT
from bcl_stream.planner.config import MAX_RANKS
from bcl_stream.process_layout import ProcessLayout

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


ACCEPT, REFUSE, EITHER = "accept", "refuse", "either"
TOP_KEYS = ("version", "epoch", "packs_consumed", "fingerprint", "config", "segments")
"""What every state holds; without any of them it is refused."""
READABLE_VERSIONS = (5, 6, GOOD["version"])
"""This release's version, and 5 (a version 5 state holds no canonical ranks, read as before)."""
REFUSED_EXTRAS = ("mixture", "canonical_steps", "step_micro_batches")
"""Keys that belong to another kind of loader (a mixture, canonical ranks) than this one."""
RESIZABLE = ("world_size", "ranks_per_node")
SEGMENT_KEYS = ("world_size", "ranks_per_node", "packs_consumed")
N_RECORDS = len(INDEX)


def _declared(cls: type, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every config field's path and declared default (``dataclasses.MISSING``: required),
    nested config dataclasses walked into: what a state's missing field reads as."""
    hints = typing.get_type_hints(cls)
    out: dict[tuple[str, ...], Any] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out.update(_declared(kind, (*prefix, f.name)))  # type: ignore[arg-type]
        else:
            out[(*prefix, f.name)] = f.default
    return out


DECLARED = _declared(ReaderConfig)


@dataclass(frozen=True)
class Verdict:
    """What the state's contract says the loader must do with a state."""

    outcome: str
    why: str
    epoch: int = 0
    consumed: int = 0
    saved_size: tuple[int, int] | None = None
    """The saved (world_size, ranks_per_node) where it differs from the loader's."""
    segments: tuple[Segment, ...] = ()


def _count(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _same(value: Any, want: Any) -> str:
    """ACCEPT: the same JSON value; EITHER: equal numbers of another type (2.0, 1 for true);
    REFUSE: another value."""
    if value == want and type(value) is type(want):
        return ACCEPT
    numbers = (int, float)
    if isinstance(value, numbers) and isinstance(want, numbers) and value == want:
        return EITHER
    return REFUSE


def _get(raw: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(raw, dict) or part not in raw:
            return False, None
        raw = raw[part]
    return True, raw


def _config_verdict(raw: Any) -> tuple[str, str, tuple[int, int] | None]:
    """(outcome, why, saved size if resized) for the state's ``config``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("plan"), dict):
        return REFUSE, "config or config.plan is not a dict", None
    top = {path[0] for path in DECLARED}
    nested = {path[1] for path in DECLARED if len(path) == 2}
    if set(raw) - top or set(raw["plan"]) - nested:
        return REFUSE, "config has a key the release does not know", None
    outcome, why, size = ACCEPT, "config", {}
    for path, default in DECLARED.items():
        _, want = _get(GOOD["config"], path)
        if not _get(GOOD["config"], path)[0]:
            want = default  # a field the genuine state leaves out reads as its default
        present, value = _get(raw, path)
        if not present:
            if default is dataclasses.MISSING:
                return REFUSE, f"config {path} missing, no default", None
            value = default
        if path[-1] in RESIZABLE:
            if not _count(value, 1, MAX_RANKS):
                return REFUSE, f"config {path}={value!r} is not a rank count", None
            size[path[-1]] = value
            continue
        same = _same(value, want)
        if same == REFUSE:
            return REFUSE, f"config {path}={value!r}, the loader has {want!r}", None
        if same == EITHER:
            outcome, why = EITHER, f"config {path}={value!r} for {want!r}"
    world, per_node = size["world_size"], size["ranks_per_node"]
    if world % per_node:
        return REFUSE, f"ranks_per_node={per_node} does not divide world_size={world}", None
    resized = None if (world, per_node) == (CONFIG.plan.world_size, 1) else (world, per_node)
    return outcome, why, resized


def _segments(raw: Any) -> tuple[Segment, ...] | None:
    """The segments of a well-formed list (None: malformed, refused)."""
    if not isinstance(raw, list):
        return None
    out = []
    for seg in raw:
        if not isinstance(seg, dict) or sorted(seg) != sorted(SEGMENT_KEYS):
            return None
        ok = (_count(seg["world_size"], 1, MAX_RANKS), _count(seg["ranks_per_node"], 1, MAX_RANKS),
              _count(seg["packs_consumed"], 0, MAX_COUNT))  # fmt: skip
        if not all(ok):
            return None
        out.append(Segment(seg["world_size"], seg["ranks_per_node"], seg["packs_consumed"]))
    return tuple(out)


def old_packs(config: ReaderConfig, epoch: int, rank: int) -> np.ndarray | None:
    """The uninterrupted plan's packs of ``rank`` in ``epoch`` under ``config`` (None: no
    plan: not one pack for a rank)."""
    if config.plan.world_size * config.plan.pack_size > N_RECORDS:
        return None  # fewer records than one pack per rank: nothing to plan
    try:
        return MemoryDataset(INDEX, config, rank).epoch_plan(epoch, ()).rank_packs(rank)
    except ValueError:
        return None


def verdict(state: Any) -> Verdict:
    """Accept, refuse or either for ``state``, decided from how it differs from ``GOOD``."""
    if not isinstance(state, dict):
        return Verdict(REFUSE, "not a dict")
    missing = [k for k in TOP_KEYS if k not in state]
    if missing:
        return Verdict(REFUSE, f"missing {missing}")
    version, epoch, consumed = state["version"], state["epoch"], state["packs_consumed"]
    if type(version) is not int or version not in READABLE_VERSIONS:
        return Verdict(REFUSE, f"version {version!r}")
    if not (_count(epoch, 0, MAX_COUNT) and _count(consumed, 0, MAX_COUNT)):
        return Verdict(REFUSE, f"epoch {epoch!r} or packs_consumed {consumed!r}")
    if state["fingerprint"] != GOOD["fingerprint"]:
        return Verdict(REFUSE, "fingerprint")
    segments = _segments(state["segments"])
    if segments is None:
        return Verdict(REFUSE, f"segments {state['segments']!r}")
    extras = set(state) - set(TOP_KEYS)
    if any(state[k] is not None for k in extras & set(REFUSED_EXTRAS)):
        return Verdict(REFUSE, f"another loader's key among {sorted(extras)}")
    outcome, why, saved_size = _config_verdict(state["config"])
    if outcome == REFUSE:
        return Verdict(REFUSE, why)
    if extras - set(REFUSED_EXTRAS):
        outcome, why = EITHER, f"keys this release does not write: {sorted(extras)}"
    if segments:
        outcome, why = EITHER, "elastic segments"  # their plans are the planner's to decide
    elif saved_size is not None:
        old = old_packs(
            CONFIG.resized(ProcessLayout(world_size=saved_size[0], ranks_per_node=saved_size[1])),
            epoch,
            0,
        )
        if old is None or consumed > old.shape[0]:
            return Verdict(REFUSE, f"{consumed} packs consumed of the {saved_size} plan")
    elif consumed > old_packs(CONFIG, epoch, 0).shape[0]:  # type: ignore[union-attr]
        return Verdict(REFUSE, f"{consumed} packs consumed, more than the epoch holds")
    return Verdict(outcome, why, epoch, consumed, saved_size, segments)


def load_or_state_error(state: Any) -> None:
    """The property: the loader accepts or refuses ``state`` as :func:`verdict` says, and an
    accepted state replays the uninterrupted run."""
    expected = verdict(state)
    loader = fresh_loader()
    try:
        loader.load_state_dict(copy.deepcopy(state))
    except StateError as exc:
        assert str(exc)  # a message, not an empty error
        assert expected.outcome != ACCEPT, f"refused a state to accept ({expected.why}): {exc}"
        return
    assert expected.outcome != REFUSE, f"accepted a state to refuse: {expected.why}"
    if expected.saved_size is not None and not expected.segments:
        check_elastic_replay(state, expected)
        return
    e, c = expected.epoch, expected.consumed
    plan = loader.plan_dataset.epoch_plan(e, expected.segments).rank_packs(0)
    # A state saved at the end of an epoch resumes at the next one; an epoch left without a
    # pack (an elastic resume after which no pack fits) stays the epoch, and yields nothing.
    if c and c == plan.shape[0]:
        plan, c = loader.plan_dataset.epoch_plan(e + 1, ()).rank_packs(0), 0
    got = [[s["sample_id"] for s in pack] for pack in loader]
    assert got == plan[c:].tolist(), f"the replay differs from the uninterrupted run ({expected})"


def check_elastic_replay(state: dict[str, Any], expected: Verdict) -> None:
    """A state saved on another world size, resumed on this one: every rank here yields the
    same number of packs, and no record the old ranks consumed (their uninterrupted plans'
    first packs) comes again, nor any twice."""
    assert expected.saved_size is not None
    old_config = CONFIG.resized(
        ProcessLayout(world_size=expected.saved_size[0], ranks_per_node=expected.saved_size[1])
    )
    consumed = [
        old_packs(old_config, expected.epoch, r)[: expected.consumed]  # type: ignore[index]
        for r in range(old_config.plan.world_size)
    ]
    resumed = []
    for rank in range(CONFIG.plan.world_size):
        loader = fresh_loader(rank=rank)
        loader.load_state_dict(copy.deepcopy(state))
        resumed.append([[s["sample_id"] for s in pack] for pack in loader])
    assert len({len(packs) for packs in resumed}) == 1, "ranks yield different pack counts"
    check_every_record_once([consumed, resumed], what="elastic resume")
    assert max((i for p in resumed for pack in p for i in pack), default=0) < N_RECORDS


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
@example(key="version", value=5)  # the older version this release reads
@example(key="packs_consumed", value=10)  # the epoch end: resumes at the next epoch
@example(key="packs_consumed", value=11)  # more than the epoch holds
@example(key="epoch", value=3)
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
@example(key=("plan", "world_size"), value=11)  # 11 ranks have no room for 2 packs each
@example(key=("plan", "world_size"), value=1)
@example(key=("plan", "ranks_per_node"), value=2)  # one node of the two ranks
@example(key=("seed",), value=5.0)  # the same number as a float: either
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
