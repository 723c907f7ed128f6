"""Fuzzing the planner's public entry points with bad input: a carry state cut short or
tampered with, shard tables built from bad arrays, configs with bad values, streams built on
mismatched arrays.

The property everywhere: the call either plans correctly (checked against the untouched plan)
or raises ``ValueError`` (or one of our errors) whose message names the argument at fault,
never an ``IndexError``, ``KeyError``, ``TypeError`` or a numpy error from deep inside.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bcl_stream.errors import BCLStreamError, PlanError
from bcl_stream.planner import PlanConfig, ShardTable, plan_epoch, plan_windows, shard_weights
from bcl_stream.planner.bcl import build_node_streams
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.shard_table import KeepFilter

FUZZ = settings(max_examples=150, deadline=None)

COSTS = np.random.default_rng(1).lognormal(2.0, 1.0, 400)
COUNTS = [60] * 6 + [40]
TABLE = ShardTable.build(COUNTS, weight=shard_weights(COUNTS, COSTS))
CONFIG = PlanConfig(world_size=2, pack_size=3, window=2, carry=3, shard_group=2)
STREAMS = build_node_streams(COSTS, TABLE, CONFIG, seed=4, epoch=0)
ROWS = np.arange(STREAMS.n_rows)
FULL = plan_epoch(COSTS, TABLE, CONFIG, seed=4, epoch=0).packs
SPLIT = 3
"""Plan windows [0, SPLIT), then [SPLIT, n) from the first call's carry."""
HEAD = plan_windows(STREAMS, COSTS, None, ROWS, 0, SPLIT)


def refused_with_a_name(exc: BaseException, *names: str) -> None:
    """The error is ours or a ValueError, and its message names one of ``names``."""
    assert isinstance(exc, ValueError | BCLStreamError), f"{type(exc).__name__}: {exc}"
    assert any(n in str(exc) for n in names), f"message names none of {names}: {exc}"


def test_the_windowed_baseline_equals_the_whole_epoch() -> None:
    """What the fuzzers perturb: resuming at window SPLIT from the true carry is exact."""
    tail = plan_windows(STREAMS, COSTS, None, ROWS, SPLIT, None, HEAD.carry)
    assert np.array_equal(np.concatenate([HEAD.packs, tail.packs], axis=1), FULL)


def plan_tail_or_refuse(carry: Any) -> None:
    try:
        tail = plan_windows(STREAMS, COSTS, None, ROWS, SPLIT, None, carry)
    except Exception as exc:
        refused_with_a_name(exc, "carry")
        return
    assert np.array_equal(np.concatenate([HEAD.packs, tail.packs], axis=1), FULL)


carry_values = (
    st.tuples(
        hnp.arrays(
            np.int64,
            hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
            elements=st.integers(-3, 500) | st.just(2**62),
        ),
        st.sampled_from([np.int64, np.int32, np.float64, np.uint64, np.bool_]),
    ).map(lambda pair: pair[0].astype(pair[1]))
    | st.none()
    | st.lists(st.integers(-3, 500), max_size=6)
    | st.text(max_size=4)
    | st.integers()
)


@FUZZ
@given(carry=carry_values)
def test_random_carry(carry: Any) -> None:
    plan_tail_or_refuse(carry)


@FUZZ
@given(
    edit=st.sampled_from(["drop_col", "drop_row", "add_col", "dup", "other", "range", "swap"]),
    where=st.integers(0, 100),
    value=st.integers(-5, 1000),
)
def test_tampered_carry(edit: str, where: int, value: int) -> None:
    """The true carry, cut short, widened, or with one id replaced."""
    carry = HEAD.carry.copy()
    rows, width = carry.shape
    r, c = where % rows, (where // rows) % max(width, 1)
    if edit == "drop_col":
        carry = carry[:, :-1]
    elif edit == "drop_row":
        carry = carry[:-1]
    elif edit == "add_col":
        carry = np.concatenate([carry, carry[:, :1]], axis=1)
    elif edit == "dup" and width > 1:
        carry[r, (c + 1) % width] = carry[r, c]
    elif edit == "other":
        # One held id swapped for another id: refused unless that id is another record the
        # same window read fresh; such a carry passes the structural checks but is not the
        # one the plan produced (plan_windows' docstring: pass the previous call's carry or
        # None), so only the shape of the result is checked then.
        carry[r, c] = value % len(COSTS)
        try:
            tail = plan_windows(STREAMS, COSTS, None, ROWS, SPLIT, None, carry)
        except Exception as exc:
            refused_with_a_name(exc, "carry")
            return
        assert tail.packs.shape == FULL[:, HEAD.packs.shape[1] :].shape
        return
    elif edit == "range":
        carry[r, c] = value if value < 0 else len(COSTS) + value
    elif edit == "swap" and rows > 1:
        carry[[0, 1]] = carry[[1, 0]]  # another row's carry
    plan_tail_or_refuse(carry)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ("range", r"carry holds ids outside \[0, 400\)"),
        ("dup", r"carry of row \d+ .* not held back by window 2"),
        ("width", r"window 3 needs a carry of 3 records per row, got 2"),
        ("rows", r"carry has 1 rows? but 2 rows are planned"),
        ("float", r"carry must be an integer array"),
    ],
)
def test_bad_carry_messages(edit: str, match: str) -> None:
    carry = HEAD.carry.copy()
    if edit == "range":
        carry[0, 0] = 10_000
    elif edit == "dup":
        carry[0, 1] = carry[0, 0]
    elif edit == "width":
        carry = carry[:, :2]
    elif edit == "rows":
        carry = carry[:1]
    else:
        carry = carry.astype(np.float64)
    with pytest.raises(ValueError, match=match):
        plan_windows(STREAMS, COSTS, None, ROWS, SPLIT, None, carry)


@FUZZ
@given(
    rows=st.lists(st.integers(-3, 5), max_size=4) | st.integers(-3, 5),
    start=st.integers(-2, 12) | st.floats(allow_nan=True) | st.none(),
    stop=st.integers(-2, 12) | st.none() | st.text(max_size=2),
)
def test_rows_and_window_ranges(rows: Any, start: Any, stop: Any) -> None:
    """Any rows and window range either plan (a slice of the whole plan) or are refused."""
    try:
        batch = plan_windows(STREAMS, COSTS, None, rows, start, stop)
    except Exception as exc:
        refused_with_a_name(exc, "rows", "windows", "start", "stop", "carry")
        return
    row_ids = np.asarray(rows).reshape(-1)
    want = FULL[row_ids][:, batch.first_pack : batch.first_pack + batch.packs.shape[1]]
    assert start == 0 or batch.packs.shape[1] == 0 or batch.first_pack == start * CONFIG.window
    assert np.array_equal(batch.packs, want)


@FUZZ
@given(cut=st.integers(0, 399), extra=st.integers(1, 5), bad=st.sampled_from(["nan", "neg"]))
def test_cost_arrays_that_do_not_fit_the_streams(cut: int, extra: int, bad: str) -> None:
    """Costs (or tokens) of the wrong length or with bad values are named, not indexed."""
    for costs in (COSTS[:cut], np.concatenate([COSTS, np.ones(extra)])):
        with pytest.raises(ValueError, match="costs"):
            plan_windows(STREAMS, costs, None, ROWS)
    with pytest.raises(ValueError, match="costs"):
        plan_windows(STREAMS, COSTS.reshape(20, 20), None, ROWS)
    costs = COSTS.copy()
    costs[cut] = np.nan if bad == "nan" else -1.0
    try:  # a bad value is found where the planner reads it: a record it plans
        batch = plan_windows(STREAMS, costs, None, ROWS)
    except ValueError as exc:
        assert f"costs[{cut}]" in str(exc)
    else:
        assert cut not in batch.packs
    with pytest.raises(ValueError, match="tokens"):
        plan_windows(STREAMS, COSTS, np.ones(cut, np.int64), ROWS)


# -- ShardTable.build ------------------------------------------------------------------------
array_like = (
    hnp.arrays(
        st.sampled_from([np.int64, np.float64, np.int8, np.uint64, np.bool_, np.complex128]),
        hnp.array_shapes(min_dims=0, max_dims=2, max_side=6),
    )
    | st.lists(st.integers(-5, 50) | st.floats(allow_nan=True) | st.text(max_size=2), max_size=6)
    | st.none()
    | st.text(max_size=3)
)


@FUZZ
@given(counts=array_like, usable=array_like, weight=array_like, split=array_like)
def test_shard_table_from_bad_arrays(counts: Any, usable: Any, weight: Any, split: Any) -> None:
    try:
        table = ShardTable.build(counts, usable, weight, split)
    except Exception as exc:
        refused_with_a_name(exc, "counts", "usable", "weight", "split")
        return
    n = table.counts.size
    assert table.counts.ndim == table.usable.ndim == table.weight.ndim == 1
    assert table.usable.shape == table.weight.shape == (n,)
    assert np.all(table.counts >= 0) and np.all(
        (table.usable >= 0) & (table.usable <= table.counts)
    )
    assert np.all(np.isfinite(table.weight))
    if table.split is not None:
        assert table.split.shape == (n,) and np.all((table.split >= -1) & (table.split < n))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"counts": [[1, 2], [3, 4]]}, r"counts must be 1-D"),
        ({"counts": [1.5, 2]}, r"counts must be whole numbers"),
        ({"counts": ["a"]}, r"counts must be numbers"),
        ({"counts": [1, 2], "usable": [1, 3]}, r"usable"),
        ({"counts": [1, 2], "weight": [0.0, np.inf]}, r"weight"),
        ({"counts": [1, 2], "split": [5, -1]}, r"split"),
    ],
)
def test_shard_table_messages(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ShardTable.build(**kwargs)


# -- PlanConfig ------------------------------------------------------------------------------
FIELDS = [
    "world_size", "pack_size", "window", "ranks_per_node", "scope", "max_tokens", "algorithm",
    "refine", "pack_order", "step_fill", "carry", "grad_accum", "shuffle", "stratify",
    "split_shards", "shard_group",
]  # fmt: skip
bad_values = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.sampled_from([2**63, 2**64, -(2**63)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["rank", "world", "lpt", "desc", [1], {"a": 1}, np.int64(3), np.float32(1)])
)


@FUZZ
@given(name=st.sampled_from(FIELDS), value=bad_values)
def test_plan_config_with_one_bad_field(name: str, value: Any) -> None:
    base = {"world_size": 4, "ranks_per_node": 2, "pack_size": 3, "window": 4}
    try:
        config = PlanConfig(**{**base, name: value})
    except Exception as exc:
        refused_with_a_name(exc, name)
        return
    try:
        plan = plan_epoch(COSTS, TABLE, config, seed=0, epoch=0, tokens=np.ones(400, np.int64))
    except PlanError as exc:  # a valid config the data cannot meet (max_tokens below B tokens)
        refused_with_a_name(exc, name)
        return
    assert plan.packs.shape[:1] == (config.world_size,)
    used = plan.packs.ravel()
    assert len(np.unique(used)) == used.size


# -- NodeStreams ----------------------------------------------------------------------------
@FUZZ
@given(
    seed=st.integers(-2, 5) | st.floats(allow_nan=True) | st.none() | st.just(2**70),
    epoch=st.integers(-2, 5) | st.text(max_size=2) | st.just(True),
    cut=st.integers(0, 410),
)
def test_epoch_streams_with_bad_inputs(seed: Any, epoch: Any, cut: int) -> None:
    costs = np.resize(COSTS, cut)
    keep = KeepFilter(np.ones(cut, np.int64), 5)
    for args in ((None, None), (None, costs), (keep, COSTS)):
        try:
            streams = NodeStreams(TABLE, CONFIG, seed, epoch, *args)
            streams.fetch(ROWS, 0, streams.row_length)
        except Exception as exc:
            refused_with_a_name(exc, "seed", "epoch", "costs", "tokens", "keep")
