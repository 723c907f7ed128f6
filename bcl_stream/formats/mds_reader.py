"""MDS reader: the plan's packs, read through a stock Mosaic ``StreamingDataset``.

Why random access: streaming's own iteration order (``_get_work``) is its partition and
shuffle, which we replace with the plan. ``StreamingDataset.get_item`` keeps everything else of
streaming: the download of a missing shard (any remote it supports, ``s3://`` included), the
shared cache and its eviction (``cache_limit``), and cross-worker coordination of downloads.
The dataset is built with ``shuffle=False`` so its record ids are the global write order,
which is what the plan and the cost index use.

Prefetch: for a remote dataset a background thread downloads the next ``prefetch`` shards the
plan will touch (``prepare_shard``), so a rank does not stall on S3 at each shard boundary.

Streaming traps to respect (the caller's job, once per process): set env ``RANK``,
``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` before building under a DDP launcher, call
``streaming.base.util.clean_stale_shared_memory()`` once per job before any dataset exists,
and keep one live dataset per local cache directory when ``remote`` is set.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.integrity import ShardVerifier
from bcl_stream.formats.reader_base import DatasetReader, Pack
from bcl_stream.io.dataset_dir import MDS_INDEX, read_mds_index, shard_entries
from bcl_stream.io.deadline import DownloadStalled
from bcl_stream.io.index import CostIndex
from bcl_stream.io.names import check_name
from bcl_stream.io.remote import download, is_remote, join, open_cost_index
from bcl_stream.io.streaming_compat import guard_downloads, shard_file_names
from bcl_stream.records.registry import record_ids


class _Prefetcher:
    """Downloads shards ahead of the reader, at most ``depth`` shards beyond the current one."""

    def __init__(self, dataset: Any, shards: list[int], depth: int) -> None:
        self._dataset, self._shards, self._depth = dataset, shards, depth
        self._position = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="bcl-mds-prefetch")
        self._thread.start()

    def advance(self, position: int) -> None:
        """The reader now needs ``self._shards[position]``."""
        with self._cond:
            self._position = position
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        for i, shard in enumerate(self._shards):
            with self._cond:
                while not self._stop and i > self._position + self._depth:
                    self._cond.wait()
                if self._stop:
                    return
            try:
                self._dataset.prepare_shard(int(shard), blocking=False)
            except Exception:  # the reader's own get_item retries and reports the error
                return


class MDSPackDataset(DatasetReader):
    """One rank's packs of an MDS dataset (local directory or ``s3://...``), in plan order.

    ``location``: the dataset root (holding ``index.json`` and the cost index). ``cache_dir``:
    required for remote datasets; streaming's ``local`` directory. ``options``
    (:class:`~bcl_stream.formats.read_options.ReadOptions`): ``cache_limit`` and
    ``download_timeout`` go to ``StreamingDataset``, which owns the cache, ``prefetch`` is the
    depth of our shard prefetch. Extra keyword arguments go to ``StreamingDataset`` too.
    """

    format = "mds"

    def _open_format(
        self, index: CostIndex, cache_dir: str | os.PathLike[str] | None, **streaming_kwargs: Any
    ) -> None:
        from streaming import StreamingDataset

        location = self.location
        kwargs: dict[str, Any] = {"shuffle": False, "batch_size": self.config.plan.pack_size}
        kwargs.update(self.options.streaming_kwargs())
        kwargs.update(streaming_kwargs)
        if self.remote:
            kwargs.update(remote=location, local=str(self.root))
        else:
            kwargs.update(local=str(Path(location.removeprefix("file://"))))
        self._check_index_json()
        try:
            self.streaming = StreamingDataset(**kwargs)
        except (FileNotFoundError, ValueError, TypeError, KeyError) as exc:
            raise DatasetError(
                f"{location}: Mosaic StreamingDataset cannot open it ({type(exc).__name__}: "
                f"{exc}). Check that index.json and the shards exist and are readable; a "
                "'Reused local directory' error means another live dataset (or a crashed job's "
                "shared memory: call streaming.base.util.clean_stale_shared_memory() once at job "
                "start) holds this cache_dir."
            ) from exc
        # a failed download must not hang later reads, nor a stalled one hold them past the
        # deadline (download_attempts x download_timeout)
        guard_downloads(self.streaming, self.options.download_deadline if self.remote else None)
        for i, names in enumerate(shard_file_names(self.streaming)):
            for name in names:  # what streaming itself loaded, before it touches a shard
                check_name(name, "shard", f"{location}: index.json shard entry {i}")
        self._check_layout([int(c) for c in self.streaming.samples_per_shard])
        self.verifier = ShardVerifier(self.root, self.index, location=location)
        offsets = np.asarray(self.streaming.sample_offset_per_shard, dtype=np.int64)
        self._shard_starts = offsets
        self._check_cache_fit([int(shard.get_max_size()) for shard in self.streaming.shards])

    def _open_index(
        self, location: str, cache_dir: str | os.PathLike[str] | None
    ) -> tuple[CostIndex, Path]:
        try:
            return open_cost_index(location, cache_dir, **self.options.download_limits())
        except CostIndexError:
            if not is_remote(location):  # shards without index.json: an interrupted write
                read_mds_index(Path(location.removeprefix("file://")))
            raise

    def _check_index_json(self) -> None:
        """Read ``index.json`` (a remote one fetched fresh into the cache, where streaming then
        finds it and does not fetch it again) and refuse it, before streaming sees it, when a
        shard name is unsafe (absolute, ``..``: it would be downloaded or read outside the
        cache or dataset) or its shard counts are not the cost index's (a hostile count such
        as 10**12 would size streaming's arrays; the cost index's counts sum to the length of
        the cost array on disk)."""
        if self.remote:
            download(
                join(self.location, MDS_INDEX),
                self.root / MDS_INDEX,
                timeout=self.options.download_timeout,
                retries=self.options.download_attempts - 1,
            )
        try:
            entries = shard_entries(read_mds_index(self.root)["shards"], self.root / MDS_INDEX)
        except DatasetError as exc:
            if not self.remote:
                raise
            raise type(exc)(f"{self.location}: {exc}") from exc
        self._check_layout([e.samples for e in entries])

    def _check_layout(self, counts: list[int]) -> None:
        """The streaming index and our cost index must describe the same records."""
        if counts != self.index.shard_counts:
            first = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(counts, self.index.shard_counts, strict=False))
                    if a != b
                ),
                min(len(counts), len(self.index.shard_counts)),
            )
            raise DatasetError(
                f"{self.location}: index.json and bcl_index.json disagree at shard {first} "
                f"(index.json: {len(counts)} shards, {sum(counts)} records; cost index: "
                f"{len(self.index.shards)} shards, {len(self.index)} records). The cost index "
                "belongs to other shards: rebuild it with `bcl-stream annotate`."
            )

    def shard_of(self, sample_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Shard id of each global record id."""
        return np.searchsorted(self._shard_starts, sample_ids, side="right") - 1

    def _get(self, sample_id: int, shard: int) -> dict[str, Any]:
        """Record ``sample_id`` (in shard ``shard``), checked against the shard and the index."""
        if not self.remote:  # a remote shard is checked once streaming has downloaded it
            self.verifier.check_shard(shard)
        try:
            record: dict[str, Any] = self.streaming.get_item(sample_id)
        except Exception as exc:  # botocore, streaming and numpy errors alike: name the shard
            name = self.index.shards[shard].name
            local = self.verifier.root / name
            problem = self.verifier.problem(shard) if self.remote and local.is_file() else None
            if isinstance(exc, DownloadStalled):
                problem = (
                    f"download stalled: not done within the deadline of "
                    f"{self.options.deadline_text()}"
                )
            raise DatasetError(
                f"{self.location}: cannot read record {sample_id} (shard {shard}, {name}): "
                f"{problem or f'{type(exc).__name__}: {exc}'}. "
                "Check the shard file and the remote, then resume from the last checkpoint."
            ) from exc
        if self.remote:
            self.verifier.check_shard(shard)
        record_ids(record, self.tokens, f"{self.location}: record {sample_id}")
        self.verifier.check_record(sample_id, record)
        record["sample_id"] = sample_id  # a fresh dict per call: safe to extend in place
        return record

    def _read_packs(self, packs: npt.NDArray[np.int64]) -> Iterator[Pack]:
        # Shards of every record, looked up once for all packs: a searchsorted per record
        # cost ~5 us, a fifth of reading a small record.
        shard_rows = self.shard_of(packs.ravel()).reshape(packs.shape).tolist()
        id_rows = packs.tolist()
        prefetcher = None
        if self.remote and self.prefetch > 0:
            shard_seq = np.asarray(shard_rows, dtype=np.int64).ravel()
            first = np.unique(shard_seq, return_index=True)[1]
            order = shard_seq[np.sort(first)]
            position_of = {int(s): i for i, s in enumerate(order)}
            prefetcher = _Prefetcher(self.streaming, [int(s) for s in order], self.prefetch)
        try:
            for ids, shards in zip(id_rows, shard_rows, strict=True):
                if prefetcher is not None:
                    prefetcher.advance(max(position_of[s] for s in shards))
                yield [self._get(sid, shard) for sid, shard in zip(ids, shards, strict=True)]
        finally:
            if prefetcher is not None:
                prefetcher.close()
