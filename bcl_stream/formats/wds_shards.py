"""Where every record of a WebDataset shard lies, and the node's shared cache of remote tars.

Why an index of member offsets: the plan shuffles records across a shard group (64 shards by
default), so each batch of windows a rank reads touches nearly every shard of its group. The
reader used to walk each shard's tar headers from the start for every batch (a rescan per
batch and shard: 1.5K records/s on 64K real chat records, against 40K for MDS). Now each shard's
headers are scanned once (``tar_scan.member_spans``: names, payload offsets and sizes) into a
compact :class:`ShardRecords`, kept in a small LRU per process (a shard group plus prefetch),
and every record is read with ranged reads of a memory map: any record of any shard in any
order, which is also what lets a node's ranks plan jointly (scopes ``node`` and ``world``).
Compressed tars (``.tar.gz``) have no byte ranges: they are read through once and held
decompressed in memory while in the LRU (prefer uncompressed shards).

Remote shards go to the node's shared cache directory (one ``cache_dir`` for every rank and
worker of a node). A download holds a per-shard lock file, so two processes never fetch the
same tar; the prefetch threads of a process *try* the locks of the shards it needs next and
skip the ones another process is already fetching, so a node's ranks and workers split the
downloads instead of each waiting on every shard, and a process that then needs such a shard
waits on its lock and finds it in the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from filelock import FileLock, Timeout

from bcl_stream.errors import DatasetError
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.tar_scan import (
    TAR_ERRORS,
    checked_member,
    is_compressed,
    member_spans,
    split_member,
)
from bcl_stream.io.index import CostIndex
from bcl_stream.io.names import path_under
from bcl_stream.io.remote import download, join
from bcl_stream.planner.lru import Lru

Raw = dict[str, bytes]
MAX_PARALLEL_NOW = 8
"""Most shards of the current pack fetched side by side (beyond ``prefetch``)."""
KeyCheck = Callable[[str, str, int], None]
"""(shard name, record key, expected global id) -> None or raise: the reader's key rule."""


@dataclass(frozen=True, slots=True)
class ShardRecords:
    """One shard's records: for record ``i`` (in shard order) its key and its members'
    extensions and byte ranges. About 40 bytes per member plus the key: 0.4 MB for 4096
    records of two members each, so a process holding a shard group of them stays small."""

    name: str
    keys: npt.NDArray[np.bytes_]
    """Record keys (utf-8), one per record."""
    bounds: npt.NDArray[np.int64]
    """Record i's members are ``bounds[i]:bounds[i + 1]`` of the member arrays."""
    suffix: npt.NDArray[np.int16]
    """Each member's extension, as an index into ``suffixes``."""
    suffixes: tuple[str, ...]
    offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    data: mmap.mmap | bytes
    """The uncompressed tar, mapped (or, for a compressed shard, its payloads concatenated)."""

    def __len__(self) -> int:
        return int(self.keys.size)

    def key(self, i: int) -> str:
        return bytes(self.keys[i]).decode("utf-8")

    def raw(self, i: int) -> Raw:
        """Record ``i``'s members, extension -> payload bytes (ranged reads only)."""
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        data, off, size, suffix, names = (
            self.data,
            self.offset,
            self.size,
            self.suffix,
            self.suffixes,
        )
        out: Raw = {}
        for m in range(a, b):
            start = int(off[m])
            out[names[suffix[m]]] = data[start : start + int(size[m])]
        return out

    def close(self) -> None:
        if isinstance(self.data, mmap.mmap):
            self.data.close()

    def save(self, path: Path) -> None:
        """Write the member index (not the data) to ``path`` atomically (``.npz``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                keys=self.keys,
                bounds=self.bounds,
                suffix=self.suffix,
                suffixes=np.asarray(self.suffixes, dtype=np.str_),
                offset=self.offset,
                size=self.size,
            )
        os.replace(tmp, path)


def load_members(name: str, index_path: Path, tar: Path, count: int) -> ShardRecords | None:
    """A member index saved by :meth:`ShardRecords.save` for the tar ``tar`` (None: absent,
    unreadable or not for ``count`` records: scan the tar again)."""
    try:
        with np.load(index_path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except (OSError, ValueError, KeyError, EOFError):
        return None
    if arrays.get("keys", np.empty(0)).size != count or not count:
        return None
    with open(tar, "rb") as fh:
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return ShardRecords(
        name,
        arrays["keys"],
        arrays["bounds"],
        arrays["suffix"],
        tuple(str(x) for x in arrays["suffixes"]),
        arrays["offset"],
        arrays["size"],
        data,
    )


def index_shard(name: str, path: Path, first: int, count: int, check_key: KeyCheck) -> ShardRecords:
    """Scan one tar's headers once into a :class:`ShardRecords`; check every key against the
    global record id the cost index gives it and the record count against the index. A damaged
    shard is one :class:`DatasetError` naming it and what to do."""
    keys: list[bytes] = []
    bounds: list[int] = []
    table: dict[str, int] = {}
    suffix: list[int] = []
    offset: list[int] = []
    size: list[int] = []
    previous: str | None = None
    data: mmap.mmap | bytes = b""
    try:
        spans: Iterable[tuple[str, int, int]]
        compressed = is_compressed(path)
        if compressed:
            spans, data = _read_compressed(path)
        else:
            spans = member_spans(path)
        for m, (member, at, n) in enumerate(spans):
            key, ext = split_member(member)
            if key != previous:
                check_key(name, key, first + len(keys))
                keys.append(key.encode("utf-8"))
                bounds.append(m)
                previous = key
            suffix.append(table.setdefault(ext.lower(), len(table)))
            offset.append(at)
            size.append(n)
        if offset and not compressed:
            with open(path, "rb") as fh:
                data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{name}: unreadable tar shard ({type(exc).__name__}: {exc}) at record "
            f"{first + max(len(keys) - 1, 0)}. Re-download or rewrite the shard."
        ) from exc
    bounds.append(len(offset))
    if len(keys) != count:
        if isinstance(data, mmap.mmap):
            data.close()
        raise DatasetError(
            f"{name}: holds {len(keys)} records but the cost index says {count}. The shard "
            "was changed after the cost index was written: rebuild it with `bcl-stream annotate`."
        )
    return ShardRecords(
        name,
        np.asarray(keys, dtype=np.bytes_) if keys else np.empty(0, dtype="S1"),
        np.asarray(bounds, dtype=np.int64),
        np.asarray(suffix, dtype=np.int16),
        tuple(table),
        np.asarray(offset, dtype=np.int64),
        np.asarray(size, dtype=np.int64),
        data,
    )


def _read_compressed(path: Path) -> tuple[list[tuple[str, int, int]], bytes]:
    """A compressed tar read through once: its members as spans into their payloads joined."""
    spans: list[tuple[str, int, int]] = []
    parts: list[bytes] = []
    at = 0
    with tarfile.open(path, mode="r:*") as tar:
        for info in tar:
            if not info.isreg():
                continue
            checked_member(info.name, info.offset)
            handle = tar.extractfile(info)
            payload = handle.read() if handle else b""
            spans.append((info.name, at, len(payload)))
            parts.append(payload)
            at += len(payload)
    return spans, b"".join(parts)


class ShardCache:
    """The shards one reader process reads: local paths (downloading remote tars into the
    node's shared cache, a lock per shard), the prefetch of the shards it needs next, the
    ``cache_limit`` eviction of what it downloaded, and an LRU of :class:`ShardRecords`."""

    def __init__(
        self,
        location: str,
        root: Path,
        index: CostIndex,
        options: ReadOptions,
        *,
        remote: bool,
        keep: int,
        check_key: KeyCheck,
        index_dir: Path | None = None,
    ) -> None:
        self.location, self.root, self.index, self.options = location, root, index, options
        self.index_dir = index_dir
        """Where member indexes are shared by the node's processes (None: not kept)."""
        self.remote = remote
        self._keep = max(2, keep)
        self._check_key = check_key
        counts = np.asarray(index.shard_counts, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self._reset()

    def _reset(self) -> None:
        """Per-process state: a DataLoader worker (forked or spawned) starts its own."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._records: Lru[int, ShardRecords] = Lru(self._keep, ShardRecords.close)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future[None]] = {}
        self._downloaded: list[Path] = []
        """Tars this process downloaded, oldest first (what ``cache_limit`` may evict)."""
        self._opening: set[Path] = set()
        self.downloads = 0
        """Shards this process fetched (tests and benchmarks count them)."""

    def _own(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def __getstate__(self) -> dict[str, object]:
        # No maps, locks, threads or futures cross a process boundary.
        keep: tuple[str, ...] = ("location", "root", "index", "options", "remote", "_keep")
        keep = (*keep, "_check_key", "starts", "index_dir")
        return {k: getattr(self, k) for k in keep}

    def __setstate__(self, state: dict[str, object]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._reset()

    def shard_of(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.searchsorted(self.starts, ids, side="right") - 1

    # -- records ---------------------------------------------------------------------------
    def records(self, shard: int) -> ShardRecords:
        """Shard ``shard``'s record index (scanned on first use, kept in the LRU)."""
        self._own()
        found = self._records.get(shard)
        if found is not None:
            return found
        target = self._target(shard)
        with self._lock:
            self._opening.add(target)
        try:
            path = self.path(shard)
            found = self._load_or_scan(shard, path)
        finally:
            with self._lock:
                self._opening.discard(target)
        with self._lock:
            self._records.put(shard, found)
        return found

    def _load_or_scan(self, shard: int, path: Path) -> ShardRecords:
        """The shard's member index from the node's shared copy, else scanned (and shared)."""
        entry = self.index.shards[shard]
        saved: Path | None = None
        if self.index_dir is not None and not is_compressed(path):
            stat = path.stat()
            saved = path_under(
                self.index_dir,
                f"{entry.name}.{stat.st_size}-{stat.st_mtime_ns}.npz",
                f"{self.location}: shard {shard}",
                writing=True,
            )
            found = load_members(entry.name, saved, path, entry.samples)
            if found is not None:
                return found
        first = int(self.starts[shard])
        found = index_shard(entry.name, path, first, entry.samples, self._check_key)
        if saved is not None:
            with contextlib.suppress(OSError):  # a read-only place: each process scans
                found.save(saved)
        return found

    def close(self) -> None:
        self._own()
        for rec in self._records.values():
            rec.close()
        self._records.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, {}

    # -- files -----------------------------------------------------------------------------
    def _target(self, shard: int, *, writing: bool = False) -> Path:
        """Where shard ``shard``'s tar is (or is downloaded to): its name from the cost index,
        checked to stay under the dataset or cache root (:func:`path_under`)."""
        name = self.index.shards[shard].name
        return path_under(self.root, name, f"{self.location}: shard {shard}", writing=writing)

    def path(self, shard: int) -> Path:
        """The local tar of ``shard``; a remote one is downloaded first, or waited for if
        another process of the node is fetching it. A missing local tar is a
        :class:`DatasetError` naming it."""
        target = self._target(shard, writing=self.remote)
        if not self.remote:
            if not target.is_file():
                raise DatasetError(
                    f"{self.location}: shard {shard} ({self.index.shards[shard].name}) is "
                    f"missing: {target} is not a file. The cost index lists it: restore the "
                    "shard (re-copy the dataset), or rebuild the index with `bcl-stream "
                    "annotate --overwrite` if it was removed on purpose."
                )
            return target
        pending = self._pending.pop(shard, None)
        if pending is not None:
            pending.result()
        if not target.is_file():
            self._fetch(shard, wait=True)
        return target

    def prefetch(self, upcoming: Sequence[int], now: int = 0) -> None:
        """Start fetching the first ``options.prefetch`` shards of ``upcoming`` (the shards
        the plan needs from the current pack on, in order) that are neither local nor being
        fetched, plus all of its first ``now`` (the current pack's own new shards: under the
        shuffle the first pack of an epoch needs several, which then download side by side
        instead of one after another); one thread per shard, each skipping a shard another
        process already fetches."""
        depth = self.options.prefetch
        if not self.remote or depth + now == 0:
            return
        self._own()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=depth + MAX_PARALLEL_NOW, thread_name_prefix="bcl-wds-fetch"
            )
        self._pending = {s: f for s, f in self._pending.items() if not f.done() or f.exception()}
        started = sum(1 for f in self._pending.values() if not f.done())
        limit = depth + min(now, MAX_PARALLEL_NOW)
        for shard in upcoming:
            if started >= limit:
                break
            if shard in self._pending or self._target(shard).is_file():
                continue
            self._pending[shard] = self._pool.submit(self._fetch, shard, False)
            started += 1

    def _fetch(self, shard: int, wait: bool) -> None:
        name = self.index.shards[shard].name
        target = self._target(shard, writing=True)
        where = f"{self.location}: shard {shard}"
        lock_path = path_under(self.root / ".locks", f"{name}.lock", where, writing=True)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path))
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return  # another process of the node is fetching it; path() waits for it then
        try:
            if target.is_file():
                return
            try:
                download(
                    join(self.location, name),
                    target,
                    timeout=self.options.download_timeout,
                    retries=self.options.download_attempts - 1,
                )
            except DatasetError as exc:
                raise DatasetError(
                    f"{self.location}: cannot read shard {shard} ({name}): {exc}"
                ) from exc
            with self._lock:
                self.downloads += 1
                self._downloaded.append(target)
        finally:
            lock.release()
        self.evict(keep={target})

    def evict(self, keep: set[Path]) -> None:
        """Delete the oldest tars this process downloaded while the cache holds more than
        ``cache_limit`` bytes, except ``keep`` and the ones it is opening or fetching ahead.
        A shard whose records are indexed stays readable (its map outlives the file); another
        rank of the node that still needs a deleted tar fetches it again (``cache_limit``
        below the working set: the reader warns at set-up)."""
        limit = self.options.cache_bytes
        if limit is None:
            return
        with self._lock:
            names = self.index.shards
            held = self._opening | {self.root / names[s].name for s in list(self._pending)}
            sizes = {p: p.stat().st_size for p in self._downloaded if p.is_file()}
            total = sum(sizes.values())
            for path in list(self._downloaded):
                if total <= limit:
                    break
                if path in keep or path in held or path not in sizes:
                    continue
                path.unlink(missing_ok=True)
                self._downloaded.remove(path)
                total -= sizes[path]


def member_index_dir(location: str, root: Path, cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where a node's processes share the member indexes of a dataset's tars: the cache
    directory (a remote dataset's is its shard cache), else a per-user directory under the
    temp dir named after the dataset's path. About 30 bytes per record (under 1% of a tar of
    chat records); an index is named by its tar's size and mtime, so a changed tar is scanned
    again."""
    if cache_dir is not None:
        return Path(cache_dir) / ".members"
    if root != Path(location.removeprefix("file://")):
        return root / ".members"
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"bcl-stream-members-{os.getuid()}" / digest
