"""Every use of Mosaic Streaming's and webdataset's private or unstable internals, in one place.

Why: both libraries are used below their public API where that API falls short (a download
that fails hangs later reads; ``index.json`` can overtake the last shard upload; webdataset's
writer cannot abandon an open shard). Each hook here is a small typed function whose docstring
says why it exists and exactly which internal it relies on, so an upgrade is one file to read
and ``tests/unit/test_streaming_compat.py`` to run (one test per hook, against the installed
libraries; another test fails if any other module reaches into these internals).

The internals are only stable within one release, so the supported versions are pinned
(:data:`SUPPORTED`, the same pins as ``pyproject.toml``) and checked when this module is
imported: a mismatch is an :class:`UnsupportedLibraryError` naming both versions and what to
do. A library that is not installed is not checked (its hooks fail on import as usual).

Importing this module is cheap (package metadata only): streaming (seconds to import) and
webdataset are imported inside the hooks that need them.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, Protocol, TypeVar

from bcl_stream.errors import BCLStreamError
from bcl_stream.io.deadline import within

SUPPORTED: dict[str, str] = {"mosaicml-streaming": "0.13.0", "webdataset": "1.0.2"}
"""Distribution name -> the one version whose internals the hooks below were written against
(``==`` pins in ``pyproject.toml`` and ``constraints.txt``)."""


class UnsupportedLibraryError(BCLStreamError, ImportError):
    """An installed streaming or webdataset version the compatibility hooks were not written for."""


def installed_versions() -> dict[str, str | None]:
    """Installed version of each :data:`SUPPORTED` distribution (``None``: not installed)."""
    found: dict[str, str | None] = {}
    for name in SUPPORTED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_versions(
    installed: Mapping[str, str | None], supported: Mapping[str, str] = SUPPORTED
) -> None:
    """Raise :class:`UnsupportedLibraryError` (one line) if an installed version is not the
    supported one; ``None`` (not installed) is not checked. Called at import with the real
    versions; tests pass fake ones."""
    wrong = [
        f"{name} {version} is installed but bcl-stream supports only {name}=={supported[name]}"
        for name, version in sorted(installed.items())
        if version is not None and name in supported and version != supported[name]
    ]
    if wrong:
        raise UnsupportedLibraryError(
            "; ".join(wrong) + ": install the supported version (`pip install -c constraints.txt "
            "-e .`), or update bcl_stream/io/streaming_compat.py and its SUPPORTED pins for the "
            "new version and run tests/unit/test_streaming_compat.py."
        )


check_versions(installed_versions())


# --- Mosaic Streaming: StreamingDataset ------------------------------------------------------


class _ResettingPrepare:
    """Stands in for one ``StreamingDataset``'s ``prepare_shard`` (see :func:`guard_downloads`).

    A module-level class, not a closure, so the dataset still pickles (spawned workers)."""

    def __init__(self, dataset: Any, deadline: float | None = None) -> None:
        self.dataset = dataset
        self.deadline = deadline

    def __call__(self, shard_id: int, blocking: bool = True) -> None:
        if self.deadline is None:
            self._prepare(shard_id, blocking)
            return
        # Past the deadline the call is abandoned, not the download: the shard stays
        # PREPARING (it is), and the abandoned thread puts it back to REMOTE if it fails later.
        within(self.deadline, lambda: self._prepare(shard_id, blocking), f"shard {shard_id}")

    def _prepare(self, shard_id: int, blocking: bool) -> None:
        dataset = self.dataset
        try:
            type(dataset).prepare_shard(dataset, shard_id, blocking)
        except Exception:
            from streaming.base.dataset import _ShardState

            lock = getattr(dataset, "_cache_filelock", None)
            if lock is not None:
                with lock:
                    if dataset._shard_states[shard_id] == _ShardState.PREPARING:
                        dataset._shard_states[shard_id] = _ShardState.REMOTE
            raise


def guard_downloads(dataset: Any, deadline: float | None = None) -> Any:
    """Make a failed shard download of ``dataset`` (a ``StreamingDataset``) recoverable.

    Why: in streaming 0.13 a download that raises (remote down, retries exhausted) leaves the
    shard in state ``PREPARING`` for good, and every later ``get_item`` on it waits for that
    state to change: forever (measured: a moto server answering 503 mid-epoch hung the reader
    until killed at 300 s).

    Installs, on this instance only, a ``prepare_shard`` that puts a shard left in
    ``PREPARING`` back to ``REMOTE`` and re-raises. ``get_item`` calls ``self.prepare_shard``
    internally, so every download path is covered: the reader's, the prefetch thread's and
    streaming's own. Only the caller whose download failed sees an exception (waiters poll the
    state), so the reset never takes a shard from a download that is still running.

    ``deadline`` (seconds, None: none): a shard whose preparation (download, all of
    streaming's attempts, or the wait for another thread's download of it) takes longer is
    given up with :class:`~bcl_stream.io.deadline.DownloadStalled` (the shard stays
    ``PREPARING`` while the abandoned download runs on, and goes back to ``REMOTE`` if that
    fails): streaming bounds only each socket read (boto's ``read_timeout``), so a store that
    accepts connections and never answers would hold the reader for attempts x boto's retries
    x the timeout.

    Relies on: ``StreamingDataset.prepare_shard`` being looked up on the instance,
    ``streaming.base.dataset._ShardState`` (``PREPARING``/``REMOTE``), the shared-memory array
    ``dataset._shard_states`` and its inter-process lock ``dataset._cache_filelock``.
    Output: ``dataset`` (idempotent).
    """
    if not isinstance(vars(dataset).get("prepare_shard"), _ResettingPrepare):
        dataset.prepare_shard = _ResettingPrepare(dataset, deadline)
    return dataset


def shard_file_names(dataset: Any) -> list[list[str]]:
    """The file names (raw and compressed) that a ``StreamingDataset`` will read or download
    for each of its shards, as its own ``index.json`` copy gave them.

    Why: the reader checks these names (:func:`bcl_stream.io.names.check_name`) before the
    first shard is touched, on what streaming actually loaded, not only on our own read of
    ``index.json``.

    Relies on: ``dataset.shards`` (one reader per shard) and each reader's ``file_pairs``
    (``(raw FileInfo | None, zip FileInfo | None)`` with a ``basename``).
    """
    names: list[list[str]] = []
    for shard in dataset.shards:
        found: list[str] = []
        for raw, zipped in shard.file_pairs:
            found += [info.basename for info in (raw, zipped) if info is not None]
        names.append(found)
    return names


def replace_dataset(loader: Any, dataset: Any) -> None:
    """Make a torch ``DataLoader`` read ``dataset`` from its next ``iter()`` on, its
    (persistent) workers started again: a resume that adopts a saved canonical layout reads
    through a reader built with it (a reader's config is never rewritten), and workers keep
    the copy of the reader they were started with.

    Relies on: ``DataLoader.__setattr__`` refusing ``dataset`` after construction (bypassed
    with ``object.__setattr__``; an iterable dataset's sampler does not hold it), and torch's
    private ``_iterator``, dropped as ``DataLoader`` itself does when its workers die."""
    object.__setattr__(loader, "dataset", dataset)
    loader._iterator = None


def mds_image_file_bytes(value: Any) -> bytes | None:
    """The file's bytes behind an image read from an MDS ``jpeg`` or ``png`` column, no pixel
    decoded (None: ``value`` is not such an image). An image-text dataset read in place
    (``annotate --processor``) is counted from its images' headers and re-encoded alike by the
    readers, so the stored file is what is wanted, not a re-encoding of decoded pixels.

    Relies on: streaming's ``JPEG`` and ``PNG`` encodings decoding a column as
    ``PIL.Image.open(BytesIO(data))``, left unloaded, and PIL keeping that stream as the
    image's ``fp`` (a user's stream: PIL neither closes nor drops it on load)."""
    held = getattr(value, "fp", None)
    if isinstance(held, io.BytesIO) and getattr(value, "format", None):
        return held.getvalue()
    return None


def clean_stale_shared_memory_once() -> None:
    """Remove shared memory leaked by killed streaming jobs; call once per job, in the process
    that starts it, before any dataset exists. Skipped inside launched ranks (``LOCAL_RANK``
    set): there it would open a process group of its own or race the other ranks.

    Streaming's cleanup also unlinks the shared memory of *live* streaming jobs on the same
    machine (it cannot tell them apart). Set ``BCL_STREAM_KEEP_SHM=1`` where other streaming
    jobs may be running (test suites, shared workstations); a fresh local cache directory per
    job then avoids any collision with stale memory.

    Relies on: ``streaming.base.util.clean_stale_shared_memory`` (not exported at the top).
    """
    if os.environ.get("BCL_STREAM_KEEP_SHM") == "1":
        return
    if "LOCAL_RANK" in os.environ or os.environ.get("SLURM_LOCALID", "0") != "0":
        return
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()


def set_streaming_env(local_world_size: int) -> None:
    """Export the process layout Mosaic Streaming reads (env ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``) from the initialised process group, before a dataset is built.

    Why: Lightning's ``ddp`` launcher sets ``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE`` but
    not ``RANK`` or ``LOCAL_WORLD_SIZE``; streaming names its shared memory from those three,
    and without them two ranks collide (``FileExistsError: '/0000NN_locals'``).
    ``local_world_size`` is the processes on this node, not the data-parallel ranks: under
    tensor or context parallelism the processes of a node share one streaming registration
    (one local leader, one cache), whatever data-parallel rank each reads for. Only under an
    initialised process group, and from it: a single process that plans for a rank of a larger
    world (tests, inspection) keeps streaming's defaults (rank 0 of 1) and the environment.

    Relies on: streaming's rank detection reading those variables (``streaming.base.world``).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    os.environ["RANK"] = str(dist.get_rank())
    os.environ["WORLD_SIZE"] = str(dist.get_world_size())
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)


# --- Mosaic Streaming: MDSWriter -------------------------------------------------------------

W = TypeVar("W", bound=type)


def own_index_writing(cls: W) -> W:
    """Class decorator for an ``MDSWriter`` subclass: ``finish()`` ends by calling the class's
    ``write_dataset_index()`` instead of streaming's own index writing.

    Why: the stock ending writes ``index.json`` (readers take it as "dataset complete") once
    the upload *queue* is empty, so it can overtake the last shard, and it knows nothing of our
    cost index, which must be uploaded before it.

    Relies on: ``MDSWriter.finish()`` flushing the last shard and then calling
    ``self._write_index()`` (streaming 0.13), which this routes to ``write_dataset_index``.
    """
    target = getattr(cls, "write_dataset_index", None)
    if not callable(target):
        raise TypeError(f"{cls.__name__} needs a write_dataset_index(self) method")
    setattr(cls, "_write_index", target)  # noqa: B010
    return cls


def wait_for_shard_uploads(writer: Any) -> bool:
    """Wait until every shard upload of ``writer`` (an ``MDSWriter``) has finished; output:
    ``True`` if all succeeded. Raises ``RuntimeError`` if samples are still unflushed.

    Why: the stock writer only waits for its upload queue to drain, not for the uploads.
    After this the writer can no longer upload (call it at the end, or to abort).

    Relies on: ``writer.new_samples`` (the unflushed shard), ``writer.executor`` (the
    ``ThreadPoolExecutor`` running uploads) and ``writer.event`` (set by a failed upload).
    """
    if writer.new_samples:
        raise RuntimeError("internal error: not every sample was flushed before the index")
    writer.executor.shutdown(wait=True)
    return not writer.event.is_set()


def close_shard_at(writer: Any, records: int | None) -> None:
    """Close ``writer``'s open shard (an ``MDSWriter``) once it holds ``records`` records, as
    the stock writer does at its byte limit; call before each ``write`` (None: no count limit).

    Why: ``MDSWriter`` limits shards by bytes only, and a plan deals whole shards to nodes, so
    the record count per shard is what spreads data over nodes.

    Relies on: ``writer.new_samples`` (the open shard's encoded samples), ``writer.flush_shard()``
    and ``writer._reset_cache()`` (the pair ``Writer.write`` calls at its size limit).
    """
    if records is not None and len(writer.new_samples) >= records:
        writer.flush_shard()
        writer._reset_cache()


def abandon_shard_uploads(writer: Any) -> None:
    """Stop ``writer`` (an ``MDSWriter``) after its queued shard uploads finish, unflushed
    samples left unwritten.

    Queued uploads are let finish (bounded work) rather than cancelled: streaming's callbacks
    log a traceback for every cancelled future. Relies on: ``writer.executor``.
    """
    writer.executor.shutdown(wait=True)


# --- Mosaic Streaming: MDS shards, remote storage ---------------------------------------------


class MDSShardReader(Protocol):
    """What :func:`mds_shard_reader` returns: random access to one shard's samples."""

    def get_item(self, idx: int) -> dict[str, Any]: ...


def mds_shard_reader(dirname: str, shard: Mapping[str, Any]) -> MDSShardReader:
    """A reader for one MDS shard file in ``dirname``, from its ``index.json`` entry: decodes
    every column encoding streaming supports without a ``StreamingDataset`` (no shared memory,
    no cache directory).

    Relies on: ``streaming.base.format.reader_from_json(dirname, split, entry)``.
    """
    from streaming.base.format import reader_from_json

    reader: MDSShardReader = reader_from_json(dirname, None, dict(shard))
    return reader


def decompress(algo: str, data: bytes) -> bytes:
    """The raw bytes of a compressed MDS shard (``algo`` as in its ``index.json`` entry, e.g.
    ``"zstd"`` or ``"zstd:7"``).

    Relies on: ``streaming.base.compression.decompress``.
    """
    from streaming.base.compression import decompress as stock_decompress

    return bytes(stock_decompress(algo, data))


def download_file(remote: str, local: str, timeout: float) -> None:
    """Download one object at ``remote`` to the file ``local`` with streaming's downloader for
    its scheme (credentials, endpoints such as ``S3_ENDPOINT_URL``, boto's retries), once.

    Relies on: ``streaming.base.storage.CloudDownloader.get(remote)``, ``.download(remote,
    local, timeout)`` and ``.clean_up()``.
    """
    from streaming.base.storage import CloudDownloader

    downloader = CloudDownloader.get(remote)
    try:
        downloader.download(remote, local, timeout)
    finally:
        downloader.clean_up()


class Uploader(Protocol):
    """What :func:`open_uploader` returns."""

    def upload_file(self, filename: str) -> None:
        """Upload ``staging/filename`` to ``remote_dir/filename``."""


def open_uploader(staging: str, remote_dir: str) -> Uploader:
    """Streaming's uploader for ``remote_dir``'s scheme, uploading files put in the local
    directory ``staging`` (made now: creating it checks the bucket, a request that can fail).

    Relies on: ``streaming.base.storage.CloudUploader.get((local, remote), keep_local=False,
    exist_ok=True)`` and its ``upload_file(name)``.
    """
    from streaming.base.storage import CloudUploader

    uploader: Uploader = CloudUploader.get((staging, remote_dir), keep_local=False, exist_ok=True)
    return uploader


def list_objects(location: str) -> list[str]:
    """Full object names under ``location`` for any scheme streaming supports.

    Relies on: ``streaming.base.storage.CloudUploader.get(location, ...)``, its
    ``list_objects()`` and its ``local`` directory: a temporary one for a URL (removed here);
    for a plain path, that path itself (kept).
    """
    from streaming.base.storage import CloudUploader

    uploader = CloudUploader.get(location, keep_local=False, exist_ok=True)
    try:
        return list(uploader.list_objects() or [])
    finally:
        if uploader.remote:
            shutil.rmtree(uploader.local, ignore_errors=True)


# --- webdataset ------------------------------------------------------------------------------


def wds_member_encoder() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """webdataset's default member encoder (a record dict -> a dict of bytes, by extension),
    so a writer can encode, hash the exact stored bytes, then write with ``encoder=False``.

    Relies on: ``webdataset.writer.make_encoder(True)`` (not exported at the top level).
    """
    from webdataset.writer import make_encoder

    encode: Callable[[dict[str, Any]], dict[str, Any]] = make_encoder(True)
    return encode
