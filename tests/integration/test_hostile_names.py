"""Shard names that come with the data are refused before anything is read or written for them
(issue 42, finding 1): a ``../../x/planted`` name, an absolute one, a ``../`` name of a local
dataset.

Each dataset is a real one written by our writers, then edited as an attacker would: the
shard's name changed in ``index.json`` (MDS) and ``bcl_index.json``, whose seal is recomputed
(it is a self-hash, no secret), and, on S3, the shard stored under the hostile key too, so
that a reader that follows the name finds a valid shard there. Before the fix each case
succeeded: ``inspect s3://`` and ``read`` wrote the shard outside the cache (next to the
test's temp directory here; at the filesystem root in the report), a local read read the file
outside the dataset. Now each is an ``UnsafeNameError`` (a ``DatasetError``) naming the entry
and the dataset, and no file is written outside the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from cli_process import bcl_stream_cli
from conftest import write_mds, write_wds

from bcl_stream.analysis.inspection import inspect_dataset
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError, UnsafeNameError
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.io.index_meta import FIELDS_KEY, INDEX_JSON, seal

pytestmark = pytest.mark.slow

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, shuffle=False)
PLANTED = "../../x/planted"


def rename_shard(root: Path, shard: int, new: str) -> str:
    """Rename shard ``shard`` to ``new`` in the dataset's indexes (resealing
    ``bcl_index.json`` as anyone can); output: its old name. The file itself is not moved."""
    doc = json.loads((root / INDEX_JSON).read_text())
    old = str(doc["shards"][shard]["name"])
    doc["shards"][shard]["name"] = new
    doc.pop(FIELDS_KEY)
    doc.pop("format_version")
    (root / INDEX_JSON).write_text(json.dumps(seal(doc)))
    if (root / "index.json").is_file():
        mds = json.loads((root / "index.json").read_text())
        mds["shards"][shard]["raw_data"]["basename"] = new
        (root / "index.json").write_text(json.dumps(mds))
    return old


def upload_dir(root: Path, url: str, renamed: dict[str, str]) -> None:
    """Every file of ``root`` to ``url`` (``s3://bucket/prefix``), ``renamed[file]`` as the
    object's name where given (the hostile key, stored literally: S3 keys are not paths)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    for path in sorted(root.iterdir()):
        if path.is_file():
            key = f"{prefix}/{renamed.get(path.name, path.name)}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def files_named(top: Path, name: str) -> list[Path]:
    return sorted(p for p in top.rglob(name) if p.is_file())


def read_ids(location: str, cache: Path | None) -> list[int]:
    reader = open_reader(location, CONFIG, 0, cache)
    ids = []
    for pack in reader:
        ids += [int(r["sample_id"]) for r in pack]
    return ids


WRITERS: dict[str, Callable[..., None]] = {"mds": write_mds, "wds": write_wds}


def hostile_remote(
    moto_s3: Callable[[str], str], tmp_path: Path, fmt: str, name: str, bucket: str
) -> str:
    local = tmp_path / "written"
    WRITERS[fmt](local, 60)
    old = rename_shard(local, 0, name)
    url = moto_s3(bucket) + "/ds"
    upload_dir(local, url, {old: name})
    return url


def assert_refused(exc: BaseException, name: str, dataset: str) -> None:
    message = str(exc)
    assert isinstance(exc, UnsafeNameError) and isinstance(exc, DatasetError), repr(exc)
    assert repr(name) in message and dataset in message, message
    assert "shard entry 0" in message, message


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_traversal_name_on_s3_is_refused_by_read(moto_s3, tmp_path: Path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    url = hostile_remote(moto_s3, tmp_path, fmt, PLANTED, f"hostile-read-{fmt}")
    cache = tmp_path / "a" / "b" / "cache"  # ../../x/planted from it is tmp_path/a/x/planted
    with pytest.raises(DatasetError) as caught:
        read_ids(url, cache)
    assert_refused(caught.value, PLANTED, url)
    assert files_named(tmp_path, "planted") == []


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_traversal_name_on_s3_is_refused_by_inspect(
    moto_s3, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    url = hostile_remote(moto_s3, tmp_path, fmt, PLANTED, f"hostile-inspect-{fmt}")
    temp = tmp_path / "t1" / "t2"  # inspect's download dir is t2/bcl_inspect_*: ../.. is t1
    temp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    report = inspect_dataset(url)
    assert not report["ok"] and len(report["problems"]) == 1, report
    problem = report["problems"][0]
    assert repr(PLANTED) in problem and url in problem and "climbs out" in problem, problem
    assert files_named(tmp_path, "planted") == []


def test_inspect_cli_says_it_in_one_line(moto_s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = hostile_remote(moto_s3, tmp_path, "mds", PLANTED, "hostile-cli")
    temp = tmp_path / "t1" / "t2"
    temp.mkdir(parents=True)
    proc = bcl_stream_cli("inspect", url, env={**os.environ, "TMPDIR": str(temp)}, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert repr(PLANTED) in proc.stdout + proc.stderr
    assert files_named(tmp_path, "planted") == []


def test_absolute_wds_name_on_s3_is_refused(moto_s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "abs" / "planted.tar"  # the old reader downloaded the shard here
    url = hostile_remote(moto_s3, tmp_path, "wds", str(target), "hostile-absolute")
    with pytest.raises(DatasetError) as caught:
        read_ids(url, tmp_path / "cache")
    assert_refused(caught.value, str(target), url)
    assert "is absolute" in str(caught.value)
    assert not target.exists() and files_named(tmp_path, "planted.tar") == []


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_local_dotdot_name_is_refused_not_read(tmp_path: Path, fmt: str) -> None:
    root = tmp_path / "ds"
    WRITERS[fmt](root, 60)
    want = read_ids(str(root), None)
    outside = tmp_path / "outside"
    outside.mkdir()
    old = rename_shard(root, 0, "../outside/shard")
    shutil.move(root / old, outside / "shard")  # the shard is there: a read would succeed
    with pytest.raises(DatasetError) as caught:
        read_ids(str(root), None)
    assert_refused(caught.value, "../outside/shard", str(root))
    assert len(want) > 0


def test_names_stock_tools_write_are_kept(tmp_path: Path) -> None:
    """A merged dataset's names (``part/shard``, as streaming's merge_index and our merge
    write them) still read: the rule refuses climbing out, not subdirectories."""
    root = tmp_path / "ds"
    write_wds(root, 60)
    want = read_ids(str(root), None)
    part = root / "part-0-of-1"
    part.mkdir()
    for i, shard in enumerate(json.loads((root / INDEX_JSON).read_text())["shards"]):
        old = rename_shard(root, i, f"part-0-of-1/{shard['name']}")
        shutil.move(root / old, part / old)
    assert read_ids(str(root), None) == want


def test_traversal_name_on_s3_is_refused_by_annotate(
    moto_s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """``annotate`` downloads every shard ``index.json`` names into a temporary directory."""
    from bcl_stream.preprocess.annotate import annotate

    url = hostile_remote(moto_s3, tmp_path, "mds", PLANTED, "hostile-annotate")
    temp = tmp_path / "t1" / "t2" / "t3"  # annotate's shard dir is two levels below it
    temp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(UnsafeNameError, match=r"shard entry 0 \(raw_data\.basename\)"):
        annotate(url, overwrite=True, progress=False)
    assert files_named(tmp_path, "planted") == []
