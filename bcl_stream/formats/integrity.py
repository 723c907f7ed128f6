"""Shard and record integrity checks: catch a damaged shard before its bytes become a record.

Why this exists: Mosaic's MDS reader trusts the shard file. Measured on streaming 0.13 with a
300-record dataset: a flipped byte in a record's payload is read back silently as a wrong
token; a flipped byte in the offset table or a truncated file surfaces as ``IndexError``,
``ValueError: buffer size must be a multiple of element size`` or a reshape error from deep
inside ``streaming/base/format``; none names the problem. Three cheap layers fix that:

1. :func:`mds_shard_problem` checks a shard file against its ``index.json`` entry before the
   first read: present, size equal to the recorded ``bytes`` (truncation), header sample count
   and offset table consistent (structural damage), and the content hash when the writer
   recorded one (``hashes=["xxh64"]``), and each record's xxh64 when ``annotate`` stored
   record hashes in the cost index (stock ``MDSWriter`` records no shard hash by default); a
   hash is the only layer that sees a flipped payload byte. Cost: one read of the shard (a few
   ms per 64 MB with xxh64), once per shard per process.
2. :meth:`ShardVerifier.check_record` compares a decoded record's token count with the cost
   index: a different length means the shard and the index disagree (an index from another
   dataset, or damage that slipped past 1 in a hash-less shard).
3. :func:`verify_mds` runs 1 over a whole dataset (with a progress bar) for ``inspect``-style
   checks before a long job.

Remote downloads have a fourth trap (a failed download hangs later reads of its shard); its
fix reaches into streaming's internals, so it lives with the others:
:func:`bcl_stream.io.streaming_compat.guard_downloads`.

Every problem is a :class:`~bcl_stream.errors.DatasetError` naming the file, what is wrong
and what to do. Nothing here imports streaming; content hashes come from :mod:`bcl_stream.io.hashing`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from bcl_stream.errors import DatasetError
from bcl_stream.io import streaming_compat
from bcl_stream.io.dataset_dir import read_mds_index
from bcl_stream.io.hashing import digest, sample_digest
from bcl_stream.io.index import CostIndex
from bcl_stream.io.names import name_problem
from bcl_stream.text.loss_spans import LOSS_SPANS, check_record_spans

FIX = (
    "Re-download or re-copy the dataset (for a remote dataset, delete the local cache copy), "
    "or re-run `bcl-stream preprocess --overwrite`; then resume from the last checkpoint."
)


def _header_problem(data: bytes, samples: int) -> str | None:
    """MDS layout: uint32 sample count, uint32 offsets[count + 1], the shard's JSON config, then
    the payloads; offsets are absolute and the last one is the file size."""
    if len(data) < 4:
        return f"only {len(data)} bytes, too short for an MDS header"
    count = int(np.frombuffer(data[:4], dtype="<u4")[0])
    if count != samples:
        return f"header says {count} samples, index.json says {samples}"
    end = 4 + 4 * (count + 1)
    if len(data) < end:
        return f"offset table cut off ({len(data)} bytes, header needs {end})"
    offsets = np.frombuffer(data[4:end], dtype="<u4").astype(np.int64)
    if offsets[0] < end or np.any(np.diff(offsets) < 0) or offsets[-1] != len(data):
        return "offset table is inconsistent (damaged header)"
    return None


def mds_shard_problem(
    root: str | os.PathLike[str], entry: Mapping[str, Any], *, check_hash: bool = True
) -> str | None:
    """What is wrong with one MDS shard file (``None`` if nothing), from its index.json entry.

    Compressed shards (``zip_data``) are checked for size and hash only: their header is
    inside the compressed stream.
    """
    raw = entry.get("raw_data") or {}
    zipped = entry.get("zip_data")
    info = zipped or raw
    name = info.get("basename")
    if not isinstance(name, str):
        return "index.json entry has no shard basename"
    unsafe = name_problem(name)
    if unsafe is not None:  # read_mds_index refuses these; an entry built elsewhere is checked
        return f"shard name {name[:200]!r} {unsafe}: not read"
    path = Path(root) / name
    if not path.is_file():
        return f"{name}: shard file missing"
    size = path.stat().st_size
    want = info.get("bytes")
    if isinstance(want, int) and size != want:
        kind = "truncated" if size < want else "longer than written"
        return f"{name}: {kind}: {size} bytes on disk, index.json says {want}"
    data = path.read_bytes()
    if not zipped:
        problem = _header_problem(data, int(entry.get("samples", -1)))
        if problem:
            return f"{name}: {problem}"
    hashes = info.get("hashes") or {}
    if check_hash:
        for algo, expected in sorted(hashes.items()):
            try:
                got = digest(algo, data)
            except ValueError:  # an algorithm neither streaming nor we know
                return f"{name}: index.json names an unknown hash algorithm {algo[:40]!r}"
            if got != expected:
                return f"{name}: {algo} content hash differs from index.json (corrupted bytes)"
    return None


def raw_shard_bytes(root: str | os.PathLike[str], entry: Mapping[str, Any]) -> bytes:
    """The raw (decompressed) bytes of one MDS shard: its raw file, or its compressed file
    decompressed in memory when only that is stored."""
    raw = (entry.get("raw_data") or {}).get("basename")
    path = Path(root) / str(raw)
    if path.is_file():
        return path.read_bytes()
    zipped = entry.get("zip_data") or {}
    zpath = Path(root) / str(zipped.get("basename"))
    if not zipped or not zpath.is_file():
        raise DatasetError(f"{root}: shard file {raw} is missing")
    return streaming_compat.decompress(str(entry.get("compression")), zpath.read_bytes())


def mds_record_hashes(data: bytes, name: str, samples: int) -> npt.NDArray[np.uint64]:
    """:func:`~bcl_stream.io.hashing.sample_digest` of each record of a raw MDS shard, from
    its offset table (checked first: a damaged header is a :class:`DatasetError`)."""
    problem = _header_problem(data, samples)
    if problem:
        raise DatasetError(f"{name}: {problem}")
    offsets = np.frombuffer(data[4 : 4 + 4 * (samples + 1)], dtype="<u4").tolist()
    view = memoryview(data)
    return np.fromiter(
        (sample_digest(view[a:b]) for a, b in itertools.pairwise(offsets)),
        dtype=np.uint64,
        count=samples,
    )


def mds_record_problem(
    root: str | os.PathLike[str], entry: Mapping[str, Any], first: int, hashes: npt.NDArray[Any]
) -> str | None:
    """The first record of one MDS shard whose bytes differ from its hash in the cost index
    (``hashes``: the dataset's, the shard's records from ``first``), or None."""
    name = str((entry.get("raw_data") or {}).get("basename"))
    samples = int(entry.get("samples", -1))
    try:
        got = mds_record_hashes(raw_shard_bytes(root, entry), name, samples)
    except DatasetError as exc:
        return str(exc)
    bad = np.flatnonzero(got != hashes[first : first + samples])
    if not bad.size:
        return None
    k = int(bad[0])
    return (
        f"{name}: record {k} (record {first + k} of the dataset): xxh64 content hash differs "
        "from the cost index (corrupted bytes)"
    )


def _error(location: str | os.PathLike[str], problem: str) -> DatasetError:
    return DatasetError(f"{location}: damaged shard: {problem}. {FIX}")


class ShardVerifier:
    """Checks each MDS shard of one dataset once per process, on first use, plus records.

    ``root``: the local directory holding the shard files (a remote dataset's cache dir).
    ``location``: how errors name the dataset (its URL for a remote one).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        index: CostIndex,
        *,
        location: str | None = None,
        check_hash: bool = True,
    ) -> None:
        self.root = Path(root)
        self.location = location or str(root)
        self.index = index
        self.check_hash = check_hash
        self._entries: list[dict[str, Any]] | None = None
        self._verified: set[int] = set()

    def entries(self) -> list[dict[str, Any]]:
        if self._entries is None:
            self._entries = list(read_mds_index(self.root)["shards"])
        return self._entries

    def problem(self, shard: int) -> str | None:
        """What is wrong with shard ``shard`` now (``None`` if nothing); not cached."""
        entries = self.entries()
        if not 0 <= shard < len(entries):
            return f"shard {shard} is not in index.json ({len(entries)} shards)"
        return mds_shard_problem(self.root, entries[shard], check_hash=self.check_hash)

    def check_shard(self, shard: int) -> None:
        """Raise :class:`DatasetError` if shard ``shard`` is damaged (checked once)."""
        if shard in self._verified:
            return
        problem = self.problem(shard)
        if problem is None and self.check_hash and self.index.record_hashes is not None:
            first = sum(s.samples for s in self.index.shards[:shard])
            problem = mds_record_problem(
                self.root, self.entries()[shard], first, self.index.record_hashes
            )
        if problem:
            raise _error(self.location, problem)
        self._verified.add(shard)

    def check_record(
        self, sample_id: int, record: Mapping[str, Any], field: str = "input_ids"
    ) -> None:
        """Raise if the decoded record's token count (or its loss mask's trained count)
        differs from the cost index's."""
        if field not in record:  # a column renamed in index.json: the record is not usable
            raise DatasetError(
                f"{self.location}: record {sample_id} has no {field!r} column (its columns: "
                f"{sorted(record)[:8]}): index.json does not describe the shards the cost index "
                "was written for. Re-copy the dataset, or rebuild its index with preprocess "
                "--overwrite."
            )
        got = len(record[field])
        want = int(self.index.tokens[sample_id])
        if got != want:
            raise DatasetError(
                f"{self.location}: record {sample_id} has {got} tokens but the cost index says "
                f"{want}: the shards and bcl_index.json do not belong together (or a shard is "
                "damaged). Rebuild the cost index with `bcl-stream annotate`, or re-copy the "
                "dataset."
            )
        where = f"{self.location}: record {sample_id}"
        if LOSS_SPANS in record:
            check_record_spans(record, self.index.trained_of(sample_id), where)


def verify_mds(
    root: str | os.PathLike[str], *, check_hash: bool = True, progress: bool = False
) -> list[str]:
    """Every damaged shard of a local MDS dataset, one line each (empty: all good)."""
    entries = read_mds_index(Path(root))["shards"]
    problems = []
    for entry in tqdm(entries, desc="verify", unit="shard", disable=not progress):
        problem = mds_shard_problem(root, entry, check_hash=check_hash)
        if problem:
            problems.append(problem)
    return problems
