"""Remote datasets (``s3://`` and the other schemes Mosaic Streaming supports).

We use streaming's own downloaders and uploaders (credentials, endpoints such as
``S3_ENDPOINT_URL``, retries inside boto) and add bounded retries with a clear error on top.
streaming is imported lazily: it takes seconds to import and the planner must not need it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.index import (
    COSTS_NPY,
    HASHES_NPY,
    INDEX_JSON,
    CostIndex,
    read_index,
    read_index_json,
)

DEFAULT_RETRIES = 3
T = TypeVar("T")


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def join(location: str, name: str) -> str:
    """``location/name`` for local paths and URLs alike."""
    return location.rstrip("/") + "/" + name


def with_retries(
    what: str, action: Callable[[], T], retries: int = DEFAULT_RETRIES, backoff: float = 0.2
) -> T:
    """``action()`` retried up to ``retries`` times with exponential backoff; then one
    :class:`DatasetError` line naming ``what``, the last error and what to do (chained)."""
    for attempt in range(retries + 1):
        try:
            return action()
        except FileNotFoundError:
            raise
        except Exception as exc:
            if attempt == retries:
                raise DatasetError(
                    f"{what} failed after {retries + 1} attempts: {type(exc).__name__}: "
                    f"{_one_line(exc)}. Check the endpoint (S3_ENDPOINT_URL), credentials and "
                    "network, then resume from the last checkpoint."
                ) from exc
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _with_retries(what: str, action: Any, retries: int, backoff: float) -> None:
    with_retries(what, action, retries, backoff)


def download(
    remote: str,
    local: str | os.PathLike[str],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: float = 0.2,
    timeout: float = 60.0,
) -> Path:
    """Download one file (replacing any local copy) with bounded retries."""
    from streaming.base.storage import CloudDownloader

    target = Path(local)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".")
    os.close(fd)
    os.unlink(tmp_name)

    def fetch() -> None:
        downloader = CloudDownloader.get(remote)
        try:
            downloader.download(remote, tmp_name, timeout)
        finally:
            downloader.clean_up()

    try:
        _with_retries(f"download of {remote}", fetch, retries, backoff)
    except FileNotFoundError:
        raise DatasetError(f"{remote}: not found on the remote store") from None
    os.replace(tmp_name, target)
    return target


def upload(
    local: str | os.PathLike[str], remote_dir: str, name: str, *, retries: int = DEFAULT_RETRIES
) -> None:
    """Upload ``local`` to ``remote_dir/name`` with bounded retries."""
    from streaming.base.storage import CloudUploader

    staging = tempfile.mkdtemp(prefix="bcl_upload_")
    try:
        shutil.copyfile(local, os.path.join(staging, name))
        what = f"upload of {name} to {remote_dir}"
        uploader = with_retries(
            what,
            lambda: CloudUploader.get((staging, remote_dir), keep_local=False, exist_ok=True),
            retries,
        )
        with_retries(what, lambda: uploader.upload_file(name), retries)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def open_cost_index(
    location: str, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[CostIndex, Path]:
    """Load a dataset's cost index, local or remote. Output: (index, local directory holding it).

    Remote: ``bcl_index.json`` is always fetched fresh (it is small); ``bcl_costs.npy`` (and
    ``bcl_hashes.npy`` when the JSON names it) only when a cached copy is missing or its hash
    differs.
    """
    if not is_remote(location):
        root = Path(location.removeprefix("file://"))
        if not root.is_dir():
            raise DatasetError(f"{root}: no such dataset directory")
        return read_index(root), root
    if cache_dir is None:
        raise ValueError(f"a local cache_dir is required for the remote dataset {location}")
    root = Path(cache_dir)
    try:
        download(join(location, INDEX_JSON), root / INDEX_JSON)
    except DatasetError as exc:
        raise CostIndexError(
            f"{join(location, INDEX_JSON)}: cannot fetch the cost index ({exc}). If the dataset has "
            f"none yet, run `bcl-stream annotate {location}`."
        ) from None
    try:
        return read_index(root), root
    except CostIndexError:
        names = [COSTS_NPY]
        if read_index_json(root).get("record_hashes"):
            names.append(HASHES_NPY)
        for name in names:
            download(join(location, name), root / name)
        return read_index(root), root
