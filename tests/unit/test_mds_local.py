"""The local MDS writer that imports no streaming (``formats/mds_local.py``) writes the bytes
streaming's ``MDSWriter`` writes, through the costed writer's shared counting and ending:
every file of the dataset compared, shards closed by bytes and by records, masks, text
columns; and what it cannot write is refused, not written otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import written_files

from bcl_stream.formats.mds_local import LocalCostedMDSWriter, MDSShards, size_bytes
from bcl_stream.formats.mds_writer import CostedMDSWriter


def _records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(1, 700))  # shapes past 255: a uint16 shape
        ids = rng.integers(0, 2**32 - 1, length, dtype=np.uint64).astype(np.uint32)
        record: dict[str, Any] = {"input_ids": ids, "source": f"file é {i}.jsonl:{i + 1}"}
        if i % 3:
            record["loss_spans"] = np.asarray([0, max(length // 2, 1)], dtype=np.uint32)
        out.append(record)
    return out


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"size_limit": 4096},
        {"size_limit": "3kb", "shard_records": 7},
        {"size_limit": None, "shard_records": 5},
        {"loss_spans": False},
    ],
)
def test_every_file_is_what_streaming_writes(tmp_path: Path, options: dict[str, Any]) -> None:
    masks = options.pop("loss_spans", True)
    records = _records(40)
    if not masks:
        records = [{k: v for k, v in r.items() if k != "loss_spans"} for r in records]
    written = {}
    for name, cls in (("streaming", CostedMDSWriter), ("local", LocalCostedMDSWriter)):
        with cls(
            str(tmp_path / name),
            cost_model="llama3-8b",
            columns={"input_ids": "ndarray:uint32", "source": "str"},
            loss_spans=masks,
            extra={"note": "same"},
            **options,
        ) as writer:
            for record in records:
                writer.write(record)
        written[name] = written_files(tmp_path / name)
    assert written["local"].keys() == written["streaming"].keys()
    assert sum(name.endswith(".mds") for name in written["local"]) >= (2 if options else 1)
    for name, data in written["streaming"].items():
        assert written["local"][name] == data, name


def test_what_it_cannot_write_is_refused(tmp_path: Path) -> None:
    columns = {"input_ids": "ndarray:uint32"}
    with pytest.raises(ValueError, match="encodings"):
        MDSShards(columns={"x": "pkl"}, out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="uncompressed"):
        MDSShards(columns=columns, out=str(tmp_path / "b"), compression="zstd")
    with pytest.raises(ValueError, match="local directory"):
        MDSShards(columns=columns, out="s3://bucket/data")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("")
    with pytest.raises(FileExistsError):
        MDSShards(columns=columns, out=str(tmp_path / "c"))
    writer = MDSShards(columns=columns, out=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="wrong dtype"):
        writer.write({"input_ids": np.arange(3, dtype=np.int64)})
    with pytest.raises(ValueError, match="0 elements"):
        writer.write({"input_ids": np.zeros(0, dtype=np.uint32)})


def test_size_limits_read_as_streaming_reads_them() -> None:
    from streaming.base.util import bytes_to_int

    for value in (1024, 1.5, "1024", "100b", "64mb", "1.5gb", " 2KB ", "3tb"):
        assert size_bytes(value) == bytes_to_int(value)
    for bad in ("mb", "1.5", "ten"):
        with pytest.raises(ValueError):
            bytes_to_int(bad)
        with pytest.raises(ValueError):
            size_bytes(bad)
