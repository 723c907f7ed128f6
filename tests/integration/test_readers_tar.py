"""The header-only tar scanner agrees with ``tarfile`` on every layout it may meet, and fails
loudly on corruption (the WebDataset reader depends on it to skip payloads)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import tar_record_counts
from bcl_stream.formats.tar_scan import TarFormatError, split_member, tar_members, tar_records
from bcl_stream.formats.wds_reader import load_npy
from bcl_stream.io.dataset_dir import write_mds_index

pytestmark = pytest.mark.shared_process


def write_tar(path: Path, members: dict[str, bytes], fmt: int, mode: str = "w") -> None:
    with tarfile.open(path, mode, format=fmt) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("somedir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a regular file: skipped by both


MEMBERS = {
    "0000000000.input_ids.npy": b"x" * 700,
    "0000000000.json": b"{}",
    "d/" + "long" * 40 + ".json": b"1" * 512,  # needs a long-name extension
    "0000000001.txt": "é".encode() * 3,
    "empty.bin": b"",
}


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_scanner_matches_tarfile(tmp_path: Path, fmt: int, mode: str) -> None:
    members = dict(MEMBERS)
    if fmt == tarfile.USTAR_FORMAT:  # ustar has no long names beyond prefix + name
        members = {k: v for k, v in members.items() if len(k) < 100}
    path = tmp_path / "a.tar"
    write_tar(path, members, fmt, mode)
    got = [(name, read()) for name, read in tar_members(path)]
    assert got == list(members.items())


def test_unread_payloads_are_skipped_and_reads_can_be_selective(wds_dir: Path) -> None:
    shard = wds_dir / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        expected = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    seen = {}
    for i, (name, read) in enumerate(tar_members(shard)):
        seen[name] = read() if i % 3 == 0 else None
    assert list(seen) == list(expected)
    assert all(v == expected[k] for k, v in seen.items() if v is not None)


def test_corrupt_header_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    write_tar(path, MEMBERS, tarfile.PAX_FORMAT)
    data = bytearray(path.read_bytes())
    data[1536 + 130] ^= 0x01  # flip a bit in the second header's size field
    path.write_bytes(bytes(data))
    with pytest.raises(TarFormatError, match="bad header checksum"):
        list(tar_members(path))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(5, dtype=np.uint32),
        np.arange(0, dtype=np.uint32),
        np.arange(7, dtype=">i8"),
        np.ones((2, 3)),
        np.array(3.0),
        np.asfortranarray(np.ones((3, 2), dtype=np.int16)),
    ],
)
def test_fast_npy_decode_equals_np_load(array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    got = load_npy(buf.getvalue())
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array) and got.flags.writeable


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_records_and_counts_group_members_by_key(tmp_path: Path, mode: str) -> None:
    members = {
        "a/0001.input_ids.npy": b"ids",
        "a/0001.json": b"{}",
        "a/0002.json": b"[]",
        "0003.Meta.TXT": b"t",
    }
    path = tmp_path / "shard.tar"
    write_tar(path, members, tarfile.PAX_FORMAT, mode)
    assert list(tar_records(path)) == [
        ("a/0001", [("input_ids.npy", b"ids"), ("json", b"{}")]),
        ("a/0002", [("json", b"[]")]),
        ("0003", [("Meta.TXT", b"t")]),
    ]
    assert tar_record_counts(path) == 3
    assert split_member("d.x/k.y.z") == ("d.x/k", "y.z")


def test_record_count_of_a_damaged_tar_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, {"0.json": b"{}"}, tarfile.PAX_FORMAT)
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"shard\.tar: unreadable tar shard .*checksum") as info:
        tar_record_counts(path)
    assert "\n" not in str(info.value) and "rewrite the shard" in str(info.value)


def test_write_mds_index_adds_the_pointer_and_keeps_the_rest(tmp_path: Path) -> None:
    import json

    path = write_mds_index(tmp_path, {"version": 2, "shards": [], "extra": 1})
    assert json.loads(path.read_text()) == {
        "version": 2,
        "shards": [],
        "extra": 1,
        "bcl_index": "bcl_index.json",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]  # no temporary left
