"""Loss masks as stored spans, and the cost index's trained-token counts (format 4)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from sft_records import BAD_SPANS

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.io.index import (
    COST_DTYPE,
    COSTS_NPY,
    INDEX_JSON,
    CostIndex,
    ShardEntry,
    current_records,
    read_index,
    write_index,
)
from bcl_stream.io.index_meta import seal
from bcl_stream.text.loss_spans import (
    LossSpansError,
    check_record_spans,
    check_spans,
    full_spans,
    mask_from_spans,
    spans_from_mask,
    trained_count,
)
from tests.old_formats import write_format_3_arrays

MODEL = get_preset("llama3-8b")


@pytest.mark.parametrize("seed", range(20))
def test_spans_and_masks_round_trip_and_count_positions_after_the_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    mask = rng.random(n) < 0.4
    spans = spans_from_mask(mask)
    assert spans.dtype == np.uint32
    assert np.array_equal(check_spans(spans, n), spans)
    assert np.array_equal(mask_from_spans(spans, n), mask)
    assert trained_count(spans, n) == int(mask[1:].sum())
    assert trained_count(full_spans(n), n) == trained_count(None, n) == max(n - 1, 0)


@pytest.mark.parametrize(
    ("spans", "match"),
    [
        *BAD_SPANS,
        ([[0, 2]], "flat integer array"),
        ([0.0, 2.0], "flat integer array"),
    ],
)
def test_spans_that_break_the_stored_form_are_refused(spans, match: str) -> None:
    with pytest.raises(LossSpansError, match=match):
        check_spans(spans, 10)


def test_touching_intervals_are_allowed() -> None:
    assert trained_count(check_spans([0, 3, 3, 5], 6), 6) == 4


def test_a_read_record_whose_mask_disagrees_with_the_index_is_refused() -> None:
    record = {"input_ids": np.arange(8), "loss_spans": np.asarray([2, 5], dtype=np.uint32)}
    check_record_spans(record, 3, "data: record 4")
    with pytest.raises(DatasetError, match="data: record 4: its loss_spans train 3 tokens but"):
        check_record_spans(record, 7, "data: record 4")
    with pytest.raises(DatasetError, match="data: record 4: loss_spans reaches"):
        check_record_spans({**record, "loss_spans": [2, 9]}, 3, "data: record 4")


def index_with(trained: np.ndarray | None) -> CostIndex:
    tokens = np.asarray([0, 1, 5, 9, 2], dtype=np.uint32)
    shards = [ShardEntry("a", 2), ShardEntry("b", 3)]
    return CostIndex.build(tokens, MODEL, shards, "mds", trained=trained)


def test_trained_counts_round_trip_and_default_to_every_target(tmp_path) -> None:
    assert index_with(None).trained.tolist() == [0, 0, 4, 8, 1]
    index = index_with(np.asarray([0, 0, 2, 8, 0]))
    assert index.records.dtype == COST_DTYPE and index.has_trained
    write_index(tmp_path, index)
    back = read_index(tmp_path)
    assert back.trained.tolist() == [0, 0, 2, 8, 0]
    assert [back.trained_of(i) for i in range(5)] == [0, 0, 2, 8, 0]
    assert back.costs().tolist() == index_with(None).costs().tolist()  # compute counts all tokens
    doc = json.loads((tmp_path / INDEX_JSON).read_text())
    assert doc["format_version"] == 4
    assert doc["summary"]["trained"]["total"] == 10.0


def test_more_trained_tokens_than_targets_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"record 2: 5 trained tokens of 5"):
        index_with(np.asarray([0, 0, 5, 8, 1]))
    write_index(tmp_path, index_with(None))
    records = np.load(tmp_path / COSTS_NPY).copy()
    records["trained"][3] = 9
    np.save(tmp_path / COSTS_NPY, records)
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    meta["sha256"] = hashlib.sha256(records.tobytes()).hexdigest()
    meta.pop("fields_sha256")
    (tmp_path / INDEX_JSON).write_text(json.dumps(seal(meta)))
    with pytest.raises(CostIndexError, match=r"record 3 stores 9 trained tokens of 9"):
        read_index(tmp_path)


def test_a_format_3_index_reads_with_derived_counts_and_merges_upgraded(tmp_path) -> None:
    index = index_with(None)
    write_index(tmp_path, index)
    meta = write_format_3_arrays(tmp_path)
    meta.pop("fields_sha256")
    meta = seal(meta)
    meta["format_version"] = 3  # the seal does not cover the version itself
    (tmp_path / INDEX_JSON).write_text(json.dumps(meta))
    old = read_index(tmp_path)
    assert not old.has_trained
    assert old.trained.tolist() == [0, 0, 4, 8, 1]
    assert [old.trained_of(i) for i in range(5)] == [0, 0, 4, 8, 1]
    assert np.array_equal(current_records(old), index.records)
    write_index(tmp_path / "again", old)  # written in the current format
    assert read_index(tmp_path / "again").has_trained


def test_an_array_that_does_not_match_its_format_is_refused(tmp_path) -> None:
    write_index(tmp_path, index_with(None))
    meta = write_format_3_arrays(tmp_path)
    meta.pop("fields_sha256")
    (tmp_path / INDEX_JSON).write_text(json.dumps(seal(meta)))  # says format 4
    with pytest.raises(CostIndexError, match=r"format 4 stores .*trained"):
        read_index(tmp_path)
