"""``inspect`` checks every MDS shard as ``read`` does (issue "the user's path, second pass",
point 3: a truncated shard was "integrity: ok", exit 0, and ``read`` then refused it): size,
header and content hash of every shard, with the time it took in the report."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

PLAN = ["--world-size", "1", "--pack-size", "4", "--window", "4"]


def shard(root: Path, i: int) -> Path:
    entry = json.loads((root / "index.json").read_text())["shards"][i]
    return root / entry["raw_data"]["basename"]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte"])
def test_inspect_finds_what_read_refuses(mds_dir: Path, tmp_path: Path, damage: str) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(mds_dir, copy)
    ok = bcl_stream_cli("inspect", str(copy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "integrity: ok (checked in " in ok.stdout
    assert "every shard's size, header and offset table" in ok.stdout
    assert "content hash: xxh64 of every shard (index.json))" in ok.stdout
    assert "not checked" not in ok.stdout
    target = shard(copy, 3)
    data = bytearray(target.read_bytes())
    if damage == "truncated":
        target.write_bytes(bytes(data[: len(data) - 10]))
        expected = "truncated"
    else:
        data[-5] ^= 0xFF  # inside the last record's payload: size and header still right
        target.write_bytes(bytes(data))
        expected = "content hash differs"
    proc = bcl_stream_cli("inspect", str(copy), "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert not report["ok"] and report["integrity_seconds"] >= 0
    assert any(target.name in p and expected in p for p in report["problems"]), report["problems"]
    read = bcl_stream_cli("read", str(copy), *PLAN, "--rank", "0")
    assert read.returncode == 2 and target.name in read.stderr and expected in read.stderr


# -- stock datasets without content hashes: inspect says so; annotate adds record hashes -----


def _stock_mds(out: Path) -> Path:
    """A stock ``MDSWriter`` dataset as other tools write it: no shard hashes (its default)."""
    import numpy as np
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"input_ids": "ndarray:int32"}, size_limit=1 << 12) as w:
        for i in range(120):
            w.write({"input_ids": np.full(5 + i % 17, i, dtype=np.int32)})
    return out


def _without_record_hashes(root: Path) -> None:
    """The cost index as ``annotate`` wrote it for MDS before record hashes: none stored."""
    from bcl_stream.io.index import read_index, write_index

    index = read_index(root)
    write_index(root, replace(index, record_hashes=None))
    (root / "bcl_hashes.npy").unlink()


def test_stock_mds_annotated_then_flipped_is_caught(tmp_path: Path) -> None:
    """Stock MDSWriter stores no content hash: before, ``inspect`` claimed content hashes were
    checked and a flipped payload byte was trained silently. Now ``inspect`` says no hash
    covers the records (and how to add them); ``annotate`` stores one xxh64 per record without
    touching the shards; a flipped byte is then named by ``read`` and ``inspect``."""
    root = _stock_mds(tmp_path / "ds")
    shards = sorted(root.glob("*.mds"))
    before = {p.name: p.read_bytes() for p in shards}
    done = bcl_stream_cli("annotate", str(root), "--cost-model", "tokens", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in shards} == before  # shards untouched
    assert (root / "bcl_hashes.npy").is_file()
    ok = bcl_stream_cli("inspect", str(root))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "content hash: xxh64 of every record's bytes (bcl_hashes.npy" in ok.stdout
    assert "not checked" not in ok.stdout

    target = shards[1]
    data = bytearray(target.read_bytes())
    data[-3] ^= 0x01  # a payload byte of the shard's last record: size and header still right
    target.write_bytes(bytes(data))
    read = bcl_stream_cli("read", str(root), *PLAN, "--rank", "0")
    assert read.returncode == 2
    (line,) = read.stderr.strip().splitlines()
    last = int(json.loads((root / "index.json").read_text())["shards"][1]["samples"]) - 1
    assert f"damaged shard: {target.name}: record {last} (record " in line
    assert "xxh64 content hash differs from the cost index" in line
    proc = bcl_stream_cli("inspect", str(root), "--json")
    assert proc.returncode == 1
    assert any(f"{target.name}: record {last}" in p for p in json.loads(proc.stdout)["problems"])


def test_inspect_says_what_it_could_not_check(tmp_path: Path) -> None:
    """A stock MDS dataset costed without record hashes: ``inspect`` reports the checks that
    ran and says a flipped payload byte is not detectable, naming the fix; it claims no hash."""
    root = _stock_mds(tmp_path / "ds")
    assert bcl_stream_cli("annotate", str(root), "--cost-model", "tokens").returncode == 0
    _without_record_hashes(root)
    proc = bcl_stream_cli("inspect", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "content hash: none)" in proc.stdout
    assert (
        "integrity: not checked: no content hash covers every record: a flipped payload "
        in proc.stdout
    )
    assert f"bcl-stream annotate --overwrite {root}" in proc.stdout
    report = json.loads(bcl_stream_cli("inspect", str(root), "--json").stdout)
    assert report["checks"]["content_hash"] is None and report["checks"]["not_detectable"]


def test_stock_mds_on_s3_annotated_then_flipped_is_caught(moto_s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same on S3 (moto on 127.0.0.1): ``annotate s3://...`` stores the record hashes, and
    the reader names the damaged record of a shard replaced on the store after that."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.errors import DatasetError
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.io.remote import upload
    from bcl_stream.loading.loader import PackLoader
    from bcl_stream.preprocess.annotate import annotate

    local = _stock_mds(tmp_path / "ds")
    remote = moto_s3("bcl-stock-hashes") + "/ds"
    for path in sorted(local.iterdir()):
        upload(path, remote, path.name)
    index = annotate(remote, cost_model="tokens", progress=False)
    assert index.record_hashes is not None and len(index.record_hashes) == len(index)
    target = sorted(local.glob("*.mds"))[-1]
    data = bytearray(target.read_bytes())
    data[-3] ^= 0x01
    target.write_bytes(bytes(data))
    upload(target, remote, target.name)
    config = ReaderConfig.build(world_size=1, pack_size=4, window=2, seed=0)
    dataset = MDSPackDataset(remote, config, 0, cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetError, match=rf"{remote}: damaged shard: {target.name}: record \d+ "):
        for _ in PackLoader(dataset):
            pass
