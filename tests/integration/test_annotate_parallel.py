"""``annotate --workers K`` writes the serial run's cost index byte for byte (local and on
``s3://`` through moto on 127.0.0.1), and ``annotate --part I/N`` + ``merge`` gives the same
records, hashes and shard table; a merge over a dataset whose shards changed since is refused."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import open_file_layout
from bcl_stream.io.index import COSTS_NPY, HASHES_NPY, INDEX_FILES, INDEX_JSON, read_index
from bcl_stream.io.remote import download, open_cost_index
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.preprocess.merge import merge

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]
FILES = INDEX_FILES


@pytest.fixture(scope="module")
def datasets(
    tmp_path_factory: pytest.TempPathFactory, dataset_writers: tuple[Callable[..., None], ...]
) -> dict[str, Path]:
    """An MDS dataset of 400 records in ~20 shards and a WebDataset one in 11 shards."""
    write_mds, write_wds = dataset_writers
    root = tmp_path_factory.mktemp("annotate")
    write_mds(root / "mds", 400, seed=3, size_limit=2048)
    write_wds(root / "wds", 400, seed=4, maxcount=37)
    return {"mds": root / "mds", "wds": root / "wds"}


def _files(root: Path) -> dict[str, bytes]:
    return {n: (root / n).read_bytes() for n in FILES if (root / n).is_file()}


def _serial(datasets: dict[str, Path], fmt: str, tmp: Path) -> dict[str, bytes]:
    copy = tmp / f"serial_{fmt}"
    shutil.copytree(datasets[fmt], copy)
    annotate(copy, cost_model="tokens", overwrite=True, progress=False)
    return _files(copy)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_workers_write_the_serial_index_byte_for_byte(
    datasets: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    serial = _serial(datasets, fmt, tmp_path)
    assert (
        len(serial) == 3
    )  # bcl_costs.npy, bcl_hashes.npy (record hashes, both formats), bcl_index.json
    copy = tmp_path / "parallel"
    shutil.copytree(datasets[fmt], copy)
    index = annotate(copy, cost_model="tokens", overwrite=True, progress=False, workers=2)
    assert _files(copy) == serial
    assert len(index) == 400 and len(index.shards) > 8


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_annotate_parts_merge_to_the_serial_index(
    datasets: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    serial = read_index(datasets[fmt])  # written by our writer: what annotate must find again
    copy = tmp_path / "ds"
    shutil.copytree(datasets[fmt], copy)
    (copy / INDEX_JSON).unlink()
    for i in range(3):
        part = annotate(copy, cost_model="tokens", progress=False, part=f"{i}/3")
        assert (copy / f"part-{i}-of-3" / INDEX_JSON).is_file() and len(part) > 0
    merged = merge(copy)
    assert merged.extra["merge"]["kind"] == "annotate"
    assert merged.records.tobytes() == serial.records.tobytes()
    assert merged.shards == serial.shards  # the dataset's own shards, not copies
    if fmt == "wds":
        assert merged.record_hashes is not None and serial.record_hashes is not None
        assert np.array_equal(merged.record_hashes, serial.record_hashes)
    open_file_layout(copy, check=True)  # shard list, counts (and every record's hash, WDS)
    if fmt == "wds":  # the dataset changed after the parts were counted: refused
        shutil.copy(copy / "shard-000000.tar", copy / "shard-000099.tar")
        with pytest.raises(DatasetError, match=r"annotated parts cover 11 shards.*lists 12"):
            merge(copy)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_remote_workers_and_parts(
    moto_s3: Callable[[str], str],
    dataset_writers: tuple[Callable[..., None], ...],
    tmp_path: Path,
    fmt: str,
) -> None:
    write_mds, write_wds = dataset_writers
    remote = moto_s3(f"bcl-annotate-{fmt}") + "/ds"
    if fmt == "mds":
        write_mds(remote, 200, seed=5, size_limit=4096)
    else:
        write_wds(remote, 200, seed=5, maxcount=40)
    written, _ = open_cost_index(remote, tmp_path / "written")
    annotate(remote, cost_model="tokens", overwrite=True, progress=False)
    names = [COSTS_NPY, INDEX_JSON, HASHES_NPY]  # record hashes for both formats
    serial = {n: download(f"{remote}/{n}", tmp_path / "serial" / n).read_bytes() for n in names}
    annotate(remote, cost_model="tokens", overwrite=True, progress=False, workers=2)
    parallel = {n: download(f"{remote}/{n}", tmp_path / "par" / n).read_bytes() for n in serial}
    assert parallel == serial
    for i in range(2):
        annotate(remote, cost_model="tokens", progress=False, part=f"{i}/2", workers=2)
    merged = merge(remote)
    assert merged.records.tobytes() == written.records.tobytes()
    assert merged.shards == written.shards
    again, _ = open_cost_index(remote, tmp_path / "again")
    assert again.content_hash() == merged.content_hash()
