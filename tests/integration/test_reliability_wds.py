"""WebDataset integrity: every record the reader decodes is checked against its xxh64 in the
cost index (``bcl_hashes.npy``), so a flipped byte anywhere in a record is refused with the
shard and the record named, instead of being trained on.

Each test damages a private copy of the conftest WebDataset (300 records, 37 per shard) and
reads it through the real reader (``WDSPackDataset`` + ``PackLoader``).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from pack_oracles import check_every_record_once

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import HASHES_NPY, INDEX_JSON, read_index
from bcl_stream.loading.loader import PackLoader
from tests.old_formats import write_format_3_arrays

pytestmark = pytest.mark.slow

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, shuffle=False)
SHARD = "shard-000002.tar"
FIRST = 2 * 37  # global id of the shard's first record


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(src, dst)
    return dst


def read_all(root: Path, config: ReaderConfig = CONFIG) -> list[int]:
    """Record ids of one epoch; each record's payload must be the value of its id."""
    out = []
    for pack in PackLoader(WDSPackDataset(root, config, 0)):
        for sample in pack:
            assert np.all(sample["input_ids"] == sample["sample_id"])
            out.append(int(sample["sample_id"]))
    return out


def member_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """Member name -> (byte offset of its data, size)."""
    with tarfile.open(path) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def test_intact_dataset_reads_every_record_once(wds_dir: Path) -> None:
    assert (wds_dir / HASHES_NPY).is_file()
    assert read_index(wds_dir).record_hashes is not None
    check_every_record_once(read_all(wds_dir), len(read_index(wds_dir)))


@pytest.mark.parametrize(
    ("record", "member", "where"),
    [
        (FIRST + 5, "input_ids.npy", "last"),  # a token id: silently wrong before
        (FIRST + 5, "input_ids.npy", "first"),  # the .npy magic
        (FIRST + 11, "json", "middle"),  # metadata
        (FIRST + 36, "input_ids.npy", "last"),  # the shard's last record, its last byte
    ],
    ids=["payload-token", "payload-npy-header", "json-member", "last-record"],
)
def test_flipped_record_byte_names_shard_and_record(
    wds_dir: Path, tmp_path: Path, record: int, member: str, where: str
) -> None:
    root = copy_of(wds_dir, tmp_path)
    offset, size = member_offsets(root / SHARD)[f"{record:010d}.{member}"]
    flip(root / SHARD, offset + {"first": 0, "middle": size // 2, "last": size - 1}[where])
    match = rf"{SHARD}: record {record} \(key '{record:010d}'\): xxh64 content hash differs"
    with pytest.raises(DatasetError, match=match):
        read_all(root)


def test_flipped_header_byte_is_named(wds_dir: Path, tmp_path: Path) -> None:
    """A tar header byte (the member's name) fails the header checksum, at that record."""
    root = copy_of(wds_dir, tmp_path)
    offset, _ = member_offsets(root / SHARD)[f"{FIRST + 9:010d}.json"]
    flip(root / SHARD, offset - 512 + 3)  # inside the 512-byte header before the data
    with pytest.raises(
        DatasetError, match=rf"{SHARD}: unreadable tar shard .*checksum.* at record {FIRST + 9}"
    ):
        read_all(root)


def test_a_rank_that_skips_the_damaged_record_is_not_stopped(wds_dir: Path, tmp_path: Path) -> None:
    """Only records a reader decodes are checked: another rank's damaged record is never read
    by this rank (the header scan skips it), so this rank trains on."""
    config = ReaderConfig.build(world_size=2, pack_size=4, window=2, shuffle=False)
    root = copy_of(wds_dir, tmp_path)
    mine = set(WDSPackDataset(root, config, 0).rank_packs().ravel().tolist())
    theirs = set(WDSPackDataset(root, config, 1).rank_packs().ravel().tolist())
    victim = next(i for i in sorted(theirs) if i not in mine)
    shard = f"shard-{victim // 37:06d}.tar"
    offset, size = member_offsets(root / shard)[f"{victim:010d}.input_ids.npy"]
    flip(root / shard, offset + size - 1)
    check_every_record_once(read_all(root, config), mine)
    with pytest.raises(DatasetError, match=rf"record {victim} "):
        for _ in PackLoader(WDSPackDataset(root, config, 1)):
            pass


def test_inspect_reports_the_damaged_record(wds_dir: Path, tmp_path: Path) -> None:
    from bcl_stream.analysis.inspection import inspect_dataset

    root = copy_of(wds_dir, tmp_path)
    offset, size = member_offsets(root / SHARD)[f"{FIRST + 5:010d}.input_ids.npy"]
    flip(root / SHARD, offset + size - 1)
    report = inspect_dataset(root)
    assert not report["ok"]
    assert any(f"{SHARD}: record {FIRST + 5} " in p for p in report["problems"])


def test_annotate_writes_the_same_hashes_as_the_writer(wds_dir: Path, tmp_path: Path) -> None:
    from bcl_stream.preprocess.annotate import annotate

    root = copy_of(wds_dir, tmp_path)
    written = read_index(root).record_hashes
    index = annotate(root, cost_model="tokens", overwrite=True, progress=False)
    assert index.record_hashes is not None and np.array_equal(index.record_hashes, written)


def downgrade_to_format_1(root: Path) -> None:
    meta = write_format_3_arrays(root)
    meta["format_version"] = 1
    del meta["record_hashes"]
    (root / INDEX_JSON).write_text(json.dumps(meta))
    (root / HASHES_NPY).unlink()


def test_format_1_index_is_read_with_one_loud_warning(wds_dir: Path, tmp_path: Path) -> None:
    """An index written before record hashes still reads, and says once that records go
    unchecked and how to add the hashes; annotate then adds them and flips are caught."""
    from bcl_stream.preprocess.annotate import annotate

    root = copy_of(wds_dir, tmp_path)
    downgrade_to_format_1(root)
    with pytest.warns(UserWarning, match=r"no record hashes .* NOT be detected.*annotate --overw"):
        ids = read_all(root)
    check_every_record_once(ids, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WDSPackDataset(root, CONFIG, 0)  # once per dataset and process
    annotate(root, cost_model="tokens", overwrite=True, progress=False)
    offset, size = member_offsets(root / SHARD)[f"{FIRST:010d}.input_ids.npy"]
    flip(root / SHARD, offset + size - 1)
    with pytest.raises(DatasetError, match=rf"record {FIRST} .*content hash differs"):
        read_all(root)


def test_damaged_hash_file_is_refused(wds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(wds_dir, tmp_path)
    hashes = np.load(root / HASHES_NPY)
    hashes[3] ^= np.uint64(1)
    np.save(root / HASHES_NPY, hashes)
    with pytest.raises(CostIndexError, match=r"bcl_hashes\.npy: SHA-256 does not match.*annotate"):
        WDSPackDataset(root, CONFIG, 0)
    (root / HASHES_NPY).unlink()
    with pytest.raises(CostIndexError, match=r"record hashes are missing"):
        WDSPackDataset(root, CONFIG, 0)


def test_unknown_index_version_says_what_to_do(wds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(wds_dir, tmp_path)
    meta = json.loads((root / INDEX_JSON).read_text())
    meta["format_version"] = 5
    (root / INDEX_JSON).write_text(json.dumps(meta))
    with pytest.raises(CostIndexError, match=r"format_version 5 is not supported.*annotate"):
        WDSPackDataset(root, CONFIG, 0)
