"""Fuzzing the cost-index reader: random, truncated and bit-flipped inputs either load
correctly or raise CostIndexError — never another exception from inside numpy or json."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError
from bcl_stream.io.index import (
    COSTS_NPY,
    INDEX_JSON,
    CostIndex,
    ShardEntry,
    read_index,
    write_index,
)

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def good_files(tmp_path) -> tuple[bytes, bytes]:
    index = CostIndex.build(np.arange(1, 41), get_preset("tokens"), [ShardEntry("s0", 40)], "wds")
    write_index(tmp_path, index)
    return (tmp_path / INDEX_JSON).read_bytes(), (tmp_path / COSTS_NPY).read_bytes()


def load_or_our_error(tmp_path) -> None:
    try:
        index = read_index(tmp_path)
    except CostIndexError:
        return
    assert len(index) == sum(index.shard_counts)


@FUZZ
@given(cut=st.integers(0, 10_000), which=st.sampled_from([INDEX_JSON, COSTS_NPY]))
def test_truncated_files(tmp_path, cut: int, which: str) -> None:
    meta, npy = good_files(tmp_path)
    data = {INDEX_JSON: meta, COSTS_NPY: npy}[which]
    (tmp_path / which).write_bytes(data[: cut % (len(data) + 1)])
    load_or_our_error(tmp_path)


@FUZZ
@given(
    position=st.integers(0, 10_000),
    bit=st.integers(0, 7),
    which=st.sampled_from([INDEX_JSON, COSTS_NPY]),
)
def test_flipped_bits(tmp_path, position: int, bit: int, which: str) -> None:
    meta, npy = good_files(tmp_path)
    data = bytearray({INDEX_JSON: meta, COSTS_NPY: npy}[which])
    data[position % len(data)] ^= 1 << bit
    (tmp_path / which).write_bytes(bytes(data))
    load_or_our_error(tmp_path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    key=st.sampled_from(
        ["format_version", "format", "records", "cost_model", "shards", "sha256", "extra"]
    ),
    value=json_values,
)
def test_random_json_field_values(tmp_path, key: str, value: object) -> None:
    meta, _ = good_files(tmp_path)
    doc = json.loads(meta)
    doc[key] = value
    (tmp_path / INDEX_JSON).write_text(json.dumps(doc))
    load_or_our_error(tmp_path)


@FUZZ
@given(blob=st.binary(max_size=300))
def test_random_bytes_as_array(tmp_path, blob: bytes) -> None:
    good_files(tmp_path)
    (tmp_path / COSTS_NPY).write_bytes(blob)
    load_or_our_error(tmp_path)
