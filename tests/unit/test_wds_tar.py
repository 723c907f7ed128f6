"""WebDataset shards written with ``tarfile`` (``formats/wds_tar.py``) are the bytes
webdataset's own ``ShardWriter`` writes for the same samples (shards cut by records and by
bytes, gzip shards, text members), stock webdataset reads them, and the costed writer's
output reads back through ``WebDataset``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from conftest import written_files

from bcl_stream.formats.npy import npy_bytes
from bcl_stream.formats.wds_tar import TarShards, encode_members
from bcl_stream.formats.wds_writer import CostedWDSWriter

MTIME = 1_700_000_000.375  # a float: webdataset's time.time() goes into a PAX header


def _samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = rng.integers(0, 50_000, int(rng.integers(1, 400)), dtype=np.uint32)
        sample: dict[str, Any] = {
            "__key__": f"{i:010d}",
            "input_ids.npy": npy_bytes(ids),
            "json": f'{{"tokens": {ids.size}, "source": "f é.jsonl:{i}"}}',
        }
        if i % 2:
            sample["loss_spans.npy"] = npy_bytes(np.asarray([0, ids.size], dtype=np.uint32))
        if i % 5 == 0:
            sample["meta.txt"] = "ü" * i
        out.append(sample)
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"maxcount": 1000, "maxsize": 3e9},
        {"maxcount": 7, "maxsize": 3e9},
        {"maxcount": 1000, "maxsize": 6000.0},
        {"maxcount": 4, "maxsize": 3000.0, "gz": True},
    ],
)
def test_shards_are_the_bytes_webdatasets_writer_writes(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pattern = "shard-%06d.tar" + (".gz" if options.pop("gz", False) else "")
    samples = _samples(30)
    closed: dict[str, list[str]] = {"stock": [], "ours": []}
    # gzip stamps the time in its header: the same second for both writers
    monkeypatch.setattr(time, "time", lambda: MTIME)
    (tmp_path / "stock").mkdir()
    with wds.ShardWriter(
        str(tmp_path / "stock" / pattern),
        post=closed["stock"].append,
        verbose=0,
        mtime=MTIME,
        **options,
    ) as stock:
        for sample in samples:
            stock.write(sample)
    (tmp_path / "ours").mkdir()
    ours = TarShards(
        str(tmp_path / "ours" / pattern), post=closed["ours"].append, mtime=MTIME, **options
    )
    for sample in samples:
        ours.write(encode_members(sample))
    ours.close()
    stock_files, our_files = written_files(tmp_path / "stock"), written_files(tmp_path / "ours")
    assert len(stock_files) > (1 if options["maxcount"] < 30 or options["maxsize"] < 1e6 else 0)
    assert our_files == stock_files
    assert [Path(f).name for f in closed["ours"]] == [Path(f).name for f in closed["stock"]]


def test_members_are_encoded_as_webdatasets_encoder_encodes_them() -> None:
    from webdataset.writer import make_encoder

    plain = {"__key__": "k", "json": '{"a": 1}', "x.txt": "é", "input_ids.npy": b"\x93NUMPY"}
    assert encode_members(plain) == make_encoder(True)(plain)
    other = {"__key__": "k", "json": {"a": 1}, "ids.npy": np.arange(3, dtype=np.uint32)}
    encoded = encode_members(other)  # values only webdataset encodes: its encoder
    assert encoded == make_encoder(True)(other)


def test_costed_writer_output_reads_back_through_stock_webdataset(tmp_path: Path) -> None:
    records = [np.arange(i + 1, dtype=np.uint32) for i in range(25)]
    with CostedWDSWriter(str(tmp_path), cost_model="tokens", maxcount=10) as writer:
        for ids in records:
            writer.write({"input_ids": ids, "source": "x"})
    shards = sorted(str(p) for p in tmp_path.glob("shard-*.tar"))
    assert len(shards) == 3
    read = list(wds.WebDataset(shards, shardshuffle=False).decode())
    assert [r["__key__"] for r in read] == [f"{i:010d}" for i in range(25)]
    for ids, record in zip(records, read, strict=True):
        np.testing.assert_array_equal(record["input_ids.npy"], ids)
        assert record["json"] == {"source": "x", "tokens": ids.size}
