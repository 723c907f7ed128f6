"""The cost index: round-trip, validation, and errors that name the file and the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError
from bcl_stream.index import COSTS_NPY, INDEX_JSON, CostIndex, ShardEntry, read_index, write_index


def make_index(n: int = 100) -> CostIndex:
    tokens = np.arange(1, n + 1)
    shards = [ShardEntry("shard.00000.mds", n // 2), ShardEntry("shard.00001.mds", n - n // 2)]
    return CostIndex.build(tokens, get_preset("llama3-8b"), shards, "mds", {"note": "test"})


def test_round_trip_preserves_everything(tmp_path) -> None:
    index = make_index()
    write_index(tmp_path, index)
    back = read_index(tmp_path)
    assert np.array_equal(back.records, index.records)
    assert back.cost_model == index.cost_model
    assert back.shards == index.shards
    assert back.extra == {"note": "test"}
    assert back.fingerprint() == index.fingerprint()
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    assert meta["summary"]["tokens"]["max"] == 100.0


def test_costs_can_be_recomputed_under_another_model() -> None:
    index = make_index()
    tokens_model = get_preset("tokens")
    assert index.costs(tokens_model).tolist() == list(map(float, range(1, 101)))
    assert np.allclose(index.costs(), get_preset("llama3-8b").cost(np.arange(1, 101)), rtol=1e-6)


def test_missing_index_suggests_annotate(tmp_path) -> None:
    with pytest.raises(CostIndexError, match="bcl-stream annotate"):
        read_index(tmp_path)


def test_changed_array_fails_the_hash_check(tmp_path) -> None:
    write_index(tmp_path, make_index())
    records = np.load(tmp_path / COSTS_NPY)
    records["tokens"][5] += 1
    np.save(tmp_path / COSTS_NPY, records)
    with pytest.raises(CostIndexError, match="content hash does not match"):
        read_index(tmp_path)


def test_record_count_mismatch_is_named(tmp_path) -> None:
    write_index(tmp_path, make_index())
    records = np.load(tmp_path / COSTS_NPY)
    np.save(tmp_path / COSTS_NPY, records[:-1])
    with pytest.raises(CostIndexError, match=r"holds 99 records but bcl_index\.json says 100"):
        read_index(tmp_path)


def test_shard_counts_must_sum_to_records(tmp_path) -> None:
    with pytest.raises(CostIndexError, match="sum to 10"):
        CostIndex.build(np.ones(20), get_preset("tokens"), [ShardEntry("a", 10)], "wds")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.update(format_version=99), "format_version 99"),
        (lambda m: m.pop("sha256"), "'sha256'"),
        (lambda m: m["shards"].append({"name": 3}), "shard entry 2"),
        (lambda m: m.update(format="tfrecord"), "unknown format"),
    ],
)
def test_malformed_json_fields_are_named(tmp_path, edit, match: str) -> None:
    write_index(tmp_path, make_index())
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    edit(meta)
    (tmp_path / INDEX_JSON).write_text(json.dumps(meta))
    with pytest.raises(CostIndexError, match=match):
        read_index(tmp_path)


def test_unreadable_json_is_named(tmp_path) -> None:
    write_index(tmp_path, make_index())
    (tmp_path / INDEX_JSON).write_text("{not json")
    with pytest.raises(CostIndexError, match="unreadable JSON"):
        read_index(tmp_path)
