"""Fuzzing the cost-index reader: a random, truncated or bit-flipped input either reads back
exactly what was written (records, hashes, cost model, shards, format, provenance) or raises a
CostIndexError that names the damaged file and says to re-run ``annotate``, never another
exception from inside numpy or json, and never a silently different index."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError
from bcl_stream.io.index import (
    COSTS_NPY,
    HASHES_NPY,
    INDEX_FILES,
    INDEX_JSON,
    CostIndex,
    ShardEntry,
    read_index,
    write_index,
)
from bcl_stream.io.index_meta import COMPONENTS_FILE

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


WRITTEN = CostIndex.build(
    np.arange(1, 41),
    get_preset("llama3-8b"),
    [ShardEntry("s0", 25), ShardEntry("s1", 15)],
    "wds",
    {"note": "fuzz"},
    record_hashes=np.arange(40, dtype=np.uint64) * 7919,
)
FILES = tuple(n for n in INDEX_FILES if n != COMPONENTS_FILE)
"""A text index's files (image-text components: tests/unit/test_vision_components.py)."""


def good_files(tmp_path: Path) -> dict[str, bytes]:
    write_index(tmp_path, WRITTEN)
    return {name: (tmp_path / name).read_bytes() for name in FILES}


def same_as_written_or_named_error(tmp_path: Path) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an edit to format_version 1/2 reads unsealed
            index = read_index(tmp_path)
    except CostIndexError as exc:
        message = str(exc)
        assert any(f"{tmp_path / name}:" in message for name in FILES), message
        assert f"annotate --overwrite {tmp_path}" in message, message
        return
    assert index.records.tobytes() == WRITTEN.records.tobytes()
    assert index.record_hashes is not None and WRITTEN.record_hashes is not None
    assert index.record_hashes.tobytes() == WRITTEN.record_hashes.tobytes()
    assert (index.cost_model, index.shards, index.format) == (
        WRITTEN.cost_model,
        WRITTEN.shards,
        WRITTEN.format,
    )
    assert index.extra == WRITTEN.extra


@FUZZ
@given(cut=st.integers(0, 10_000), which=st.sampled_from(FILES))
def test_truncated_files(tmp_path, cut: int, which: str) -> None:
    data = good_files(tmp_path)[which]
    (tmp_path / which).write_bytes(data[: cut % (len(data) + 1)])
    same_as_written_or_named_error(tmp_path)


@FUZZ
@given(
    position=st.integers(0, 10_000),
    bit=st.integers(0, 7),
    which=st.sampled_from(FILES),
)
def test_flipped_bits(tmp_path, position: int, bit: int, which: str) -> None:
    data = bytearray(good_files(tmp_path)[which])
    data[position % len(data)] ^= 1 << bit
    (tmp_path / which).write_bytes(bytes(data))
    same_as_written_or_named_error(tmp_path)


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
        [
            "format_version",
            "format",
            "records",
            "cost_model",
            "shards",
            "sha256",
            "record_hashes",
            "extra",
            "fields_sha256",
            "summary",
        ]
    ),
    value=json_values,
)
def test_random_json_field_values(tmp_path, key: str, value: object) -> None:
    doc = json.loads(good_files(tmp_path)[INDEX_JSON])
    doc[key] = value
    (tmp_path / INDEX_JSON).write_text(json.dumps(doc))
    same_as_written_or_named_error(tmp_path)


@FUZZ
@given(blob=st.binary(max_size=300), which=st.sampled_from([COSTS_NPY, HASHES_NPY]))
def test_random_bytes_as_array(tmp_path, blob: bytes, which: str) -> None:
    good_files(tmp_path)
    (tmp_path / which).write_bytes(blob)
    same_as_written_or_named_error(tmp_path)
