"""Remote datasets (``s3://`` and the other schemes Mosaic Streaming supports).

We use streaming's own downloaders and uploaders (credentials, endpoints such as
``S3_ENDPOINT_URL``, retries inside boto), reached through :mod:`bcl_stream.io.streaming_compat`,
and add bounded retries with a clear error on top. streaming is imported inside those hooks
(``streaming_compat`` itself imports only package metadata): it takes seconds to import and
the planner must not need it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from bcl_stream.errors import (
    BCLStreamError,
    CostIndexError,
    DatasetError,
    RemoteAccessError,
    UnsafeNameError,
)
from bcl_stream.io.dataset_dir import (
    MDS_INDEX,
    WDS_SUFFIXES,
    detect_format,
    not_a_directory,
    read_mds_index,
)
from bcl_stream.io.deadline import DownloadStalled, within
from bcl_stream.io.index import (
    COSTS_NPY,
    HASHES_NPY,
    INDEX_FILES,
    INDEX_JSON,
    CostIndex,
    read_index,
    read_index_json,
)
from bcl_stream.io.index_meta import COMPONENTS_FILE
from bcl_stream.io.streaming_compat import download_file, list_objects, open_uploader

DEFAULT_RETRIES = 3
T = TypeVar("T")


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def join(location: str, name: str) -> str:
    """``location/name`` for local paths and URLs alike."""
    return location.rstrip("/") + "/" + name


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes/contexts, outermost first (botocore wraps urllib3 errors)."""
    seen: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in seen:
        seen.append(node)
        node = node.__cause__ or node.__context__
    return seen


def _client_error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def access_problem(url: str, exc: BaseException) -> str | None:
    """``"cause; fix"`` when ``exc`` says the store cannot be used at all (no credentials,
    no endpoint, no permission, no bucket); None for faults that may pass (timeouts, 5xx).

    Classified by exception class name, so botocore is not imported here (it is slow).
    """
    endpoint = os.environ.get("S3_ENDPOINT_URL")
    for err in _chain(exc):
        name = type(err).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
            return (
                f"no usable AWS credentials ({name}). Set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this store"
            )
        if name in ("EndpointConnectionError", "ConnectTimeoutError") or isinstance(
            err, ConnectionRefusedError
        ):
            where = f"S3_ENDPOINT_URL={endpoint}" if endpoint else "the default AWS endpoint"
            return (
                f"cannot connect to {where} ({name}: {err}). Check S3_ENDPOINT_URL, "
                "the network and that the server is running"
            )
        code = _client_error_code(err)
        if code in ("NoSuchBucket",):
            bucket = url.split("://", 1)[-1].split("/", 1)[0]
            return f"bucket {bucket!r} does not exist ({code}). Check the URL"
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return (
                f"access denied ({code}). Check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) "
                "and the bucket's permissions (S3 also answers 403 for a missing object when "
                "listing is not allowed)"
            )
    return None


def is_not_found(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) says the object does not exist."""
    for err in _chain(exc):
        if isinstance(err, FileNotFoundError) or _client_error_code(err) in (
            "404",
            "NoSuchKey",
            "NotFound",
        ):
            return True
    return False


def _with_retries(what: str, url: str, action: Any, retries: int, backoff: float) -> Any:
    """``action()`` with bounded retries. Not found: FileNotFoundError at once. A store that
    cannot be used (see :func:`access_problem`): :class:`RemoteAccessError` at once, or after
    the retries for connection errors (a server may be starting). Anything else, after the
    retries: :class:`DatasetError`. Every error keeps the last exception as its cause.
    """
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as exc:
            if is_not_found(exc):
                raise FileNotFoundError(f"{url}: not found on the remote store") from exc
            problem = access_problem(url, exc)
            connect = problem is not None and problem.startswith("cannot connect")
            if problem is not None and (not connect or attempt == retries):
                tries = f" after {attempt + 1} attempts" if connect else ""
                raise RemoteAccessError(f"{what} failed{tries}: {problem}.") from exc
            if attempt == retries:
                raise DatasetError(
                    f"{what} failed after {retries + 1} attempts: {type(exc).__name__}: {exc}. "
                    "Check the endpoint (S3_ENDPOINT_URL), credentials and network, then resume "
                    "from the last checkpoint."
                ) from exc
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def list_remote(location: str, *, retries: int = DEFAULT_RETRIES) -> list[str]:
    """Object names under a remote location, relative to it (``[]`` when nothing is there).

    ``s3://`` is listed with boto3 directly (a second, not streaming's import); other schemes
    go through streaming's uploader, which lists for every store it supports.
    """
    parsed = urlparse(location)
    prefix = parsed.path.strip("/")

    def list_s3() -> list[str]:
        import boto3

        client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
        keys: list[str] = []
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=parsed.netloc, Prefix=prefix + "/" if prefix else ""
        )
        for page in pages:
            keys += [obj["Key"] for obj in page.get("Contents", [])]
        return keys

    def list_other() -> list[str]:
        return list_objects(location)

    action = list_s3 if parsed.scheme == "s3" else list_other
    try:
        keys = _with_retries(f"listing of {location}", location, action, retries, 0.2)
    except FileNotFoundError:
        return []
    return [k[len(prefix) :].lstrip("/") for k in keys]


def remote_sizes(location: str, names: list[str]) -> list[int]:
    """Byte sizes of the objects ``names`` under ``location``, from one listing (``s3://``
    only: one request per 1000 objects); ``[]`` where the store or a name is not listed (the
    caller then has nothing to compare)."""
    parsed = urlparse(location)
    if parsed.scheme != "s3":
        return []
    prefix = parsed.path.strip("/")

    def list_sizes() -> dict[str, int]:
        import boto3

        client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
        sizes: dict[str, int] = {}
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=parsed.netloc, Prefix=prefix + "/" if prefix else ""
        )
        for page in pages:
            for obj in page.get("Contents", []):
                sizes[obj["Key"][len(prefix) :].lstrip("/")] = int(obj["Size"])
        return sizes

    sizes = _with_retries(f"listing of {location}", location, list_sizes, DEFAULT_RETRIES, 0.2)
    return [sizes[n] for n in names] if all(n in sizes for n in names) else []


def download(
    remote: str,
    local: str | os.PathLike[str],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: float = 0.2,
    timeout: float = 60.0,
) -> Path:
    """Download one file (replacing any local copy) with bounded retries: ``retries + 1``
    attempts, each given up after ``timeout`` seconds of wall-clock time, so the whole download
    ends within ``timeout x (retries + 1)`` seconds plus the back-off between attempts (the
    deadline the readers' ``download_timeout`` x ``download_attempts`` names)."""
    target = Path(local)
    target.parent.mkdir(parents=True, exist_ok=True)
    partials: list[str] = []

    def fetch() -> str:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".")
        os.close(fd)
        os.unlink(tmp_name)
        partials.append(tmp_name)  # one file per attempt: an abandoned one writes only its own
        within(timeout, lambda: download_file(remote, tmp_name, timeout), remote)
        return tmp_name

    done: str | None = None
    try:
        done = _with_retries(f"download of {remote}", remote, fetch, retries, backoff)
    except FileNotFoundError as exc:
        raise DatasetError(f"{remote}: not found on the remote store") from exc
    except DatasetError as exc:
        if isinstance(exc.__cause__, DownloadStalled):
            raise DatasetError(
                f"download of {remote} stalled: no answer within the deadline of "
                f"{retries + 1} attempts x {timeout:g} s (download_attempts x "
                f"download_timeout) = {(retries + 1) * timeout:g} s. Check the store "
                "(S3_ENDPOINT_URL) and network, raise read.download_timeout for very large "
                "shards on a slow link, then resume from the last checkpoint."
            ) from exc
        raise
    finally:
        for name in partials:  # failed and abandoned attempts' files (the one done is moved)
            if name != done:
                Path(name).unlink(missing_ok=True)
    assert done is not None
    os.replace(done, target)
    return target


def upload(
    local: str | os.PathLike[str], remote_dir: str, name: str, *, retries: int = DEFAULT_RETRIES
) -> None:
    """Upload ``local`` to ``remote_dir/name`` with bounded retries."""
    staging = tempfile.mkdtemp(prefix="bcl_upload_")
    try:
        # The uploader is made while ``staging`` is still empty: streaming warns ("exists and
        # not empty") about a non-empty local directory, which here is expected, not a problem.
        what, url = f"upload of {name} to {remote_dir}", join(remote_dir, name)
        uploader = _with_retries(  # creating it checks the bucket: a request that can fail
            what,
            url,
            lambda: open_uploader(staging, remote_dir),
            retries,
            0.2,
        )
        shutil.copyfile(local, os.path.join(staging, name))
        _with_retries(what, url, lambda: uploader.upload_file(name), retries, 0.2)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def upload_index(root: str | os.PathLike[str], remote_dir: str) -> None:
    """Upload the cost index files present in ``root``, ``bcl_index.json`` last: a reader takes
    the JSON as the index's seal, so it must never reach the store before its arrays. The
    writers and ``annotate``/``merge`` all publish an index this one way."""
    for name in INDEX_FILES:
        if os.path.isfile(os.path.join(root, name)):
            upload(os.path.join(root, name), remote_dir, name)


def missing_index_error(root: Path, shown: str | None = None) -> BCLStreamError:
    """Why a local directory without a cost index cannot be read, and the one fix that fits:
    not a dataset at all (point at what preprocess wrote), an interrupted write (re-run
    preprocess), or a complete dataset written by another tool (``bcl-stream annotate``)."""
    shown = shown or str(root)
    fmt = detect_format(root)  # DatasetError "not a dataset" when it is none
    if fmt == "mds":
        read_mds_index(root)  # DatasetError "incomplete" when index.json is missing
    return CostIndexError(
        f"{shown}: a complete {fmt} dataset but no cost index ({INDEX_JSON}); "
        f"add one with `bcl-stream annotate {shown}`"
    )


def _remote_missing_index(location: str) -> BCLStreamError:
    """:func:`missing_index_error` for a remote location, judged from its object list."""
    names = list_remote(location)
    if not names:
        return DatasetError(f"{location}: no such dataset (nothing is stored under it)")
    top = [n for n in names if "/" not in n]
    if MDS_INDEX in top or any(n.endswith(WDS_SUFFIXES) for n in top):
        return CostIndexError(
            f"{location}: a dataset but no cost index ({INDEX_JSON}); add one with "
            f"`bcl-stream annotate {location}`"
        )
    if any(".mds" in n for n in top):
        return DatasetError(
            f"incomplete dataset: {location}: MDS shards but no index.json. The write was "
            "interrupted or is still running; re-run preprocess with --overwrite."
        )
    return DatasetError(
        f"{location}: not a dataset (no index.json, no .mds shards, no .tar shards: "
        f"{', '.join(sorted(top)[:5]) or 'only subdirectories'}). Point at the directory "
        "that preprocess wrote."
    )


def open_cost_index(
    location: str,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    timeout: float = 60.0,
    attempts: int = DEFAULT_RETRIES + 1,
) -> tuple[CostIndex, Path]:
    """Load a dataset's cost index, local or remote. Output: (index, local directory holding it).

    Remote: ``bcl_index.json`` is always fetched fresh (it is small); ``bcl_costs.npy`` (and
    ``bcl_hashes.npy`` when the JSON names it) only when a cached copy is missing or its hash
    differs (:func:`_fetch_index`). An image-text index's components (``bcl_components.npz``,
    named with its SHA-256 in the sealed ``extra.components``) are fetched beside it when the
    cache lacks that file or its copy's SHA-256 differs, so a reader's two-term cost (``epoch/terms.py``) reads them where it
    reads the costs. A location without a cost index gets the error of
    :func:`missing_index_error` (not a dataset / incomplete / needs annotate). Each file's
    download ends within ``attempts`` x ``timeout`` seconds (the readers pass their
    ``download_timeout`` and ``download_attempts``).
    """
    if not is_remote(location):
        root = Path(location.removeprefix("file://"))
        if not root.is_dir():
            raise not_a_directory(root)
        if not (root / INDEX_JSON).is_file():
            raise missing_index_error(root)
        return read_index(root), root
    if cache_dir is None:
        raise ValueError(f"a local cache_dir is required for the remote dataset {location}")
    root = Path(cache_dir)
    index = _fetch_index(location, root, timeout, attempts)
    entry = index.extra.get("components")
    if isinstance(entry, dict) and entry.get("file") == COMPONENTS_FILE:
        path = root / COMPONENTS_FILE  # the one name read_components accepts, never the JSON's
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry.get(
            "sha256"
        ):
            download(join(location, COMPONENTS_FILE), path, timeout=timeout, retries=attempts - 1)
    return index, root


def _fetch_index(location: str, root: Path, timeout: float, attempts: int) -> CostIndex:
    """The remote ``location``'s cost index, read from its copy in ``root``: the JSON fetched,
    the costs (and hashes) fetched again only when the copy's do not match it."""
    url = join(location, INDEX_JSON)
    try:
        download(url, root / INDEX_JSON, timeout=timeout, retries=attempts - 1)
    except RemoteAccessError:
        raise
    except DatasetError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            raise _remote_missing_index(location) from exc
        raise CostIndexError(f"{url}: cannot fetch the cost index ({exc})") from exc
    try:
        return read_index(root)
    except UnsafeNameError as exc:  # name the dataset, not only the cache's copy
        raise UnsafeNameError(f"{location}: {exc}") from exc
    except CostIndexError:
        names = [COSTS_NPY]
        if read_index_json(root).get("record_hashes"):
            names.append(HASHES_NPY)
        for name in names:
            download(join(location, name), root / name, timeout=timeout, retries=attempts - 1)
        try:
            return read_index(root)
        except UnsafeNameError as exc:
            raise UnsafeNameError(f"{location}: {exc}") from exc
