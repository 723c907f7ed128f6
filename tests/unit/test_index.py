"""The cost index: round-trip, validation, and errors that name the file and the fix."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError
from bcl_stream.io.index import (
    COSTS_NPY,
    FORMAT_VERSION,
    INDEX_JSON,
    CostIndex,
    ShardEntry,
    read_index,
    write_index,
)
from bcl_stream.io.index_meta import seal
from tests.old_formats import write_format_3_arrays


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
        (lambda m: m.update(format="tfrecord"), "field 'format' was changed"),
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


def test_flipped_byte_in_the_array_is_detected(tmp_path) -> None:
    write_index(tmp_path, make_index())
    npy = tmp_path / COSTS_NPY
    raw = bytearray(npy.read_bytes())
    raw[-13] ^= 0x01  # one bit of one record, header untouched
    npy.write_bytes(bytes(raw))
    with pytest.raises(CostIndexError, match="content hash does not match"):
        read_index(npy.parent)
    assert read_index(tmp_path, verify=False).content_hash() != make_index().content_hash()


def test_truncated_array_is_named(tmp_path) -> None:
    write_index(tmp_path, make_index())
    npy = tmp_path / COSTS_NPY
    npy.write_bytes(npy.read_bytes()[:-3])
    with pytest.raises(CostIndexError, match=r"truncated: \d+ bytes on disk"):
        read_index(tmp_path)


def test_read_index_maps_read_only_views(tmp_path) -> None:
    write_index(tmp_path, make_index())
    index = read_index(tmp_path)
    assert isinstance(index.records.base, np.memmap)  # a plain view of the mapping
    for array in (index.records, index.tokens, index.costs()):
        assert not array.flags.writeable
        assert np.shares_memory(array, index.records)  # views, not copies
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    assert index.costs().dtype == np.float32
    assert not make_index().tokens.flags.writeable  # built indexes are immutable too


def test_other_model_costs_are_float32_chunk_by_chunk(tmp_path) -> None:
    write_index(tmp_path, make_index(1000))
    index = read_index(tmp_path)
    model = get_preset("tokens")
    got = index.costs(model)
    assert got.dtype == np.float32 and not got.flags.writeable
    assert np.array_equal(got, np.arange(1, 1001, dtype=np.float32))
    chunks = list(index.cost_chunks(model, chunk=300))
    assert [start for start, _ in chunks] == [0, 300, 600, 900]
    assert np.array_equal(np.concatenate([c for _, c in chunks]), np.arange(1, 1001))
    stored = np.concatenate([c for _, c in index.cost_chunks()])
    assert np.array_equal(stored, index.costs().astype(np.float64))


def test_pickled_mapped_index_maps_the_file_again(tmp_path) -> None:
    import pickle

    write_index(tmp_path, make_index(100_000))
    index = read_index(tmp_path)
    blob = pickle.dumps(index)
    assert len(blob) < 10_000  # the file name travels, not 800 KB of records
    back = pickle.loads(blob)
    assert isinstance(back.records.base, np.memmap)
    assert np.array_equal(back.records, index.records)
    assert back.fingerprint() == index.fingerprint()
    write_index(tmp_path, make_index(100_000))  # replaced (new inode) after the parent opened it
    with pytest.raises(CostIndexError, match="changed after this index was opened"):
        pickle.loads(blob)


def test_pickled_built_index_keeps_its_records() -> None:
    import pickle

    index = make_index()
    back = pickle.loads(pickle.dumps(index))
    assert np.array_equal(back.records, index.records)
    assert back.content_hash() == index.content_hash()


def test_edited_cost_model_is_refused_naming_the_field(tmp_path) -> None:
    """The reported case: cost_model.a edited from 1 to 4 in the JSON, the array untouched."""
    index = CostIndex.build(np.arange(1, 41), get_preset("tokens"), [ShardEntry("s", 40)], "wds")
    write_index(tmp_path, index)
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    meta["cost_model"]["a"] = 4.0
    (tmp_path / INDEX_JSON).write_text(json.dumps(meta))
    with pytest.raises(CostIndexError, match=r"field 'cost_model' was changed.*annotate --overw"):
        read_index(tmp_path)


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("cost_model", lambda m: m["cost_model"].update(k=1.0)),
        ("shards", lambda m: m["shards"].reverse()),
        ("shards", lambda m: m["shards"][0].update(name="other.mds")),
        ("extra", lambda m: m["extra"].update(note="edited")),
        ("sha256", lambda m: m.update(sha256="0" * 64)),
        ("format", lambda m: m.update(format="wds")),
        ("fields_sha256", lambda m: m.pop("fields_sha256")),
    ],
)
def test_any_sealed_edit_is_refused_naming_the_field(tmp_path, field: str, edit) -> None:
    write_index(tmp_path, make_index())
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    edit(meta)
    (tmp_path / INDEX_JSON).write_text(json.dumps(meta))
    with pytest.raises(CostIndexError, match=rf"{INDEX_JSON}: field '{field}' .*annotate"):
        read_index(tmp_path)


def test_costs_that_disagree_with_the_model_are_refused(tmp_path) -> None:
    """Even a consistently resealed JSON cannot pair the array with another model."""
    write_index(tmp_path, make_index())
    meta = json.loads((tmp_path / INDEX_JSON).read_text())
    meta["cost_model"]["a"] *= 4
    (tmp_path / INDEX_JSON).write_text(json.dumps(seal(meta)))
    with pytest.raises(
        CostIndexError, match=r"stored costs disagree with the cost model.*record 0"
    ):
        read_index(tmp_path)


def test_unsealed_format_2_index_reads_with_one_warning(tmp_path) -> None:
    write_index(tmp_path, make_index())
    meta = write_format_3_arrays(tmp_path)
    del meta["fields_sha256"]
    meta["format_version"] = 2
    meta["cost_model"]["k"] = 0.0  # unverifiable in format 2, still equal to the stored costs
    (tmp_path / INDEX_JSON).write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=r"format 2 does not seal.*annotate --overwrite"):
        back = read_index(tmp_path)
    assert np.array_equal(back.tokens, make_index().tokens)
    assert np.array_equal(back.trained, np.maximum(make_index().tokens, 1) - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_index(tmp_path)  # once per file and process
    write_index(tmp_path, back)  # what annotate --overwrite writes: sealed again
    assert json.loads((tmp_path / INDEX_JSON).read_text())["format_version"] == FORMAT_VERSION
    assert np.array_equal(read_index(tmp_path).records, make_index().records)
