"""Loss masks through the costed writers and readers: ``loss_spans`` stored (MDS column,
WebDataset ``.loss_spans.npy`` member), the cost index's trained counts, stock readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.mds_writer import CostedMDSWriter
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.formats.wds_writer import CostedWDSWriter
from bcl_stream.io.index import read_index
from bcl_stream.io.index_meta import seal
from bcl_stream.loading.loader import PackLoader
from bcl_stream.text.loss_spans import spans_from_mask, trained_count


def masked_records(n: int, seed: int = 3) -> list[dict]:
    """Record i: ids all i; every third record without a mask (trains every token)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(1, 60))
        record: dict = {"input_ids": np.full(length, i, dtype=np.uint32)}
        if i % 3:
            mask = rng.random(length) < 0.5
            record["loss_spans"] = spans_from_mask(mask)
        out.append(record)
    return out


def write(fmt: str, out: Path, recs: list[dict]) -> None:
    if fmt == "mds":
        writer: CostedMDSWriter | CostedWDSWriter = CostedMDSWriter(
            str(out), cost_model="tokens", size_limit=2048, loss_spans=True
        )
    else:
        writer = CostedWDSWriter(str(out), cost_model="tokens", maxcount=17)
    with writer:
        for record in recs:
            writer.write(record)


def expected_trained(record: dict) -> int:
    return trained_count(record.get("loss_spans"), len(record["input_ids"]))


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_masks_are_stored_counted_and_read_back(fmt: str, tmp_path: Path) -> None:
    recs = masked_records(80)
    write(fmt, tmp_path, recs)
    index = read_index(tmp_path)
    assert index.has_trained
    assert index.trained.tolist() == [expected_trained(r) for r in recs]
    assert index.tokens.tolist() == [len(r["input_ids"]) for r in recs]
    config = ReaderConfig.build(world_size=2, pack_size=2, window=4)
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    seen = 0
    for rank in range(2):
        for pack in PackLoader(reader(tmp_path, config, rank)):
            for sample in pack:
                want = recs[sample["sample_id"]]
                spans = sample.get("loss_spans")
                if "loss_spans" in want:
                    assert spans.dtype == np.uint32
                    assert np.array_equal(spans, want["loss_spans"])
                elif fmt == "mds":  # a column every record has: the full span
                    assert spans.tolist() == [0, len(want["input_ids"])]
                else:
                    assert spans is None
                got = trained_count(spans, len(sample["input_ids"]))
                assert got == int(index.trained[sample["sample_id"]])
                seen += 1
    assert seen > 0


def test_stock_readers_read_the_masks(tmp_path: Path) -> None:
    import webdataset as wds
    from streaming import StreamingDataset

    recs = masked_records(30)
    write("mds", tmp_path / "mds", recs)
    write("wds", tmp_path / "wds", recs)
    mds = StreamingDataset(local=str(tmp_path / "mds"), batch_size=1, shuffle=False)
    assert np.array_equal(mds[1]["loss_spans"], recs[1]["loss_spans"])
    urls = [str(tmp_path / "wds" / s.name) for s in read_index(tmp_path / "wds").shards]
    got = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert np.array_equal(got[1]["loss_spans.npy"], recs[1]["loss_spans"])
    assert "loss_spans.npy" not in got[0]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_bad_masks_and_counts_are_refused_at_write(fmt: str, tmp_path: Path) -> None:
    ids = np.arange(5, dtype=np.uint32)
    cases = [
        ({"input_ids": ids, "loss_spans": [3, 2]}, {}, r"record 0: loss_spans interval 0"),
        ({"input_ids": ids, "loss_spans": [0, 6]}, {}, r"record 0: .*outside the record's 5"),
        ({"input_ids": ids, "loss_spans": [1, 3]}, {"trained": 1}, r"trained=1 given, but .* 2"),
        ({"input_ids": ids}, {"trained": 5}, r"trained=5 outside \[0, 4\]"),
    ]
    for i, (sample, kwargs, match) in enumerate(cases):
        out = tmp_path / str(i)
        cls = CostedMDSWriter if fmt == "mds" else CostedWDSWriter
        extra = {"loss_spans": True} if fmt == "mds" else {}
        with (
            pytest.raises(ValueError, match=match),
            cls(str(out), cost_model="tokens", **extra) as w,
        ):
            w.write(sample, **kwargs)


def test_mds_writer_without_the_column_refuses_spans(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="create it with loss_spans=True"),
        CostedMDSWriter(str(tmp_path), cost_model="tokens") as writer,
    ):
        writer.write({"input_ids": np.arange(4, dtype=np.uint32), "loss_spans": [1, 3]})


def test_given_trained_counts_without_masks_are_stored(tmp_path: Path) -> None:
    with CostedWDSWriter(str(tmp_path), cost_model="tokens") as writer:
        writer.write({"input_ids": np.arange(6, dtype=np.uint32)}, trained=2)
        writer.write({"input_ids": np.arange(3, dtype=np.uint32)})
    assert read_index(tmp_path).trained.tolist() == [2, 2]


def test_a_mask_that_disagrees_with_the_index_is_refused_on_read(tmp_path: Path) -> None:
    """The check behind it: shards and index swapped between two masked datasets."""
    recs = masked_records(20)
    write("wds", tmp_path / "a", recs)
    other = [dict(r, loss_spans=np.asarray([0, len(r["input_ids"])], np.uint32)) for r in recs]
    write("wds", tmp_path / "b", other)
    for name in ("bcl_costs.npy", "bcl_index.json"):
        (tmp_path / "a" / name).write_bytes((tmp_path / "b" / name).read_bytes())
    (tmp_path / "a" / "bcl_hashes.npy").unlink()
    doc = json.loads((tmp_path / "a" / "bcl_index.json").read_text())
    doc.pop("fields_sha256")
    doc["record_hashes"] = None  # else the record hashes refuse the swap first
    (tmp_path / "a" / "bcl_index.json").write_text(json.dumps(seal(doc)))
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2)
    with pytest.warns(UserWarning, match="no record hashes"):
        reader = WDSPackDataset(tmp_path / "a", config, 0)
    with pytest.raises(DatasetError, match=r"its loss_spans train \d+ tokens but the cost index"):
        for _ in PackLoader(reader):
            pass
