"""The cost index: per-record token counts and costs, beside the shard index.

Two files per dataset, written before the format's own index (``index.json`` for MDS, the
shard list for WebDataset), because readers take that one as "dataset complete":

- ``bcl_costs.npy``: a structured array ordered by global record id, fields ``tokens``
  (uint32), ``cost`` (float32) and (format 4) ``trained`` (uint32: the record's trained
  tokens, the loss mask's positions t >= 1, :mod:`bcl_stream.text.loss_spans`), 12 bytes
  per record. Costs count every token: a loss mask does not change compute.
- ``bcl_index.json``: format version, dataset format, cost model, per-shard sample counts,
  the SHA-256 of the array's bytes, summary statistics, and (format 3) the seal
  ``fields_sha256`` over every field a plan depends on (:mod:`bcl_stream.io.index_meta`).
- ``bcl_hashes.npy`` (WebDataset, format 2): one xxh64 per record
  (:func:`bcl_stream.io.hashing.record_digest`), which the reader checks on every record it
  decodes, so a flipped byte inside a record is refused with the shard and record named.
  MDS shards carry their own hashes in ``index.json``.

Formats 1 to 3 are still read (their 8-byte records have no ``trained`` field:
:attr:`CostIndex.trained` is then ``max(tokens - 1, 0)``, what is trained without a mask,
computed on use, 4 B/record of private memory); an unsealed index (1, 2) warns once that an edit to its
metadata goes undetected, and a WebDataset reader of format 1 warns once that its records go
unchecked; ``bcl-stream annotate --overwrite`` adds both without rewriting the shards. On open,
a sample of stored costs is compared with the cost model applied to the stored tokens.

Memory: :func:`read_index` maps ``bcl_costs.npy`` read-only (``np.memmap``) instead of loading
it. Every process of a node (ranks and their DataLoader workers) then shares one copy through
the page cache; a private copy would cost 12 B/record per process (100M records: 1.2 GB, times
8 ranks x 4 workers). The hash check reads the file in ``HASH_CHUNK`` pieces with plain reads
on the same open file, so it neither copies the array nor maps its pages into the process.
``tools/bench_index.py`` measures open time and RSS up to 100M records.

A mapped file is never rewritten in place: writers and downloads replace it atomically
(``os.replace``), so a process that still maps the old file keeps reading consistent bytes.

Token counts are the ground truth; ``CostIndex.costs(model)`` recomputes costs under another
cost model at read time without rewriting anything (4 B/record, computed chunk by chunk).
Every problem found on read is a :class:`~bcl_stream.errors.CostIndexError` that names the
file and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel
from bcl_stream.errors import CostIndexError
from bcl_stream.io.hashing import RECORD_HASH
from bcl_stream.io.index_file import (
    COST_DTYPE,
    COST_DTYPE_V3,
    HASH_CHUNK,
    RECORD_DTYPES,
    FileIdentity,
    map_npy,
)
from bcl_stream.io.index_meta import (
    COSTS_NPY,
    FORMAT_VERSION,
    HASHES_NPY,
    INDEX_FILES,
    INDEX_JSON,
    READABLE_VERSIONS,
    TRAINED_VERSION,
    check_costs_follow_model,
    column_stats,
    read_index_json,
    seal,
)
from bcl_stream.io.index_meta import fail as _fail

__all__ = [
    "COSTS_NPY",
    "COST_DTYPE",
    "COST_DTYPE_V3",
    "FORMAT_VERSION",
    "HASHES_NPY",
    "INDEX_FILES",
    "INDEX_JSON",
    "READABLE_VERSIONS",
    "CostIndex",
    "ShardEntry",
    "current_records",
    "read_index",
    "read_index_json",
    "write_index",
]

FORMATS = ("mds", "wds")
COST_CHUNK = 1 << 20
"""Records per chunk when costs are recomputed under another model (8 MB of float64 scratch)."""


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard: its file name (relative to the dataset root) and its record count."""

    name: str
    samples: int


@dataclass(frozen=True, slots=True)
class CostIndex:
    """A dataset's cost index, in memory."""

    records: npt.NDArray[np.void]
    """Structured array (``COST_DTYPE``, or ``COST_DTYPE_V3`` read from an older index) in
    global sample order."""
    cost_model: CostModel
    """The model that produced ``records['cost']``."""
    shards: tuple[ShardEntry, ...]
    """Shards in global sample order; their counts sum to ``len(records)``."""
    format: str
    """``mds`` or ``wds``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (preprocessing report, tokenizer) kept in the JSON."""
    record_hashes: npt.NDArray[np.uint64] | None = None
    """xxh64 of each record's members in global sample order (WebDataset), or None."""
    source: FileIdentity | None = field(default=None, compare=False, repr=False)
    """The file ``records`` is mapped from (None: the records are in memory)."""
    _sha256: list[str] = field(default_factory=list, init=False, compare=False, repr=False)
    """Cache of :meth:`content_hash` (read-only records only; a list: the class is frozen)."""

    def __post_init__(self) -> None:
        hashes = self.record_hashes
        if hashes is not None and (
            hashes.dtype != np.dtype("<u8") or hashes.shape != (len(self.records),)
        ):
            raise CostIndexError(
                f"record hashes have dtype {hashes.dtype} shape {hashes.shape}, expected "
                f"uint64 ({len(self.records)},)"
            )
        if self.records.dtype not in RECORD_DTYPES:
            raise CostIndexError(
                f"cost records have dtype {self.records.dtype}, expected {COST_DTYPE}"
            )
        if self.format not in FORMATS:
            raise CostIndexError(
                f"unknown dataset format {self.format!r}; expected one of {FORMATS}"
            )
        total = sum(s.samples for s in self.shards)
        if total != len(self.records):
            raise CostIndexError(
                f"shard sample counts sum to {total} but the cost index holds {len(self.records)} records"
            )

    @classmethod
    def build(
        cls,
        tokens: npt.ArrayLike,
        cost_model: CostModel,
        shards: list[ShardEntry] | tuple[ShardEntry, ...],
        format: str,
        extra: dict[str, Any] | None = None,
        record_hashes: npt.ArrayLike | None = None,
        trained: npt.ArrayLike | None = None,
    ) -> CostIndex:
        """An index from token counts, computing costs with ``cost_model``; ``record_hashes``:
        one :func:`~bcl_stream.io.hashing.record_digest` per record (WebDataset), or None;
        ``trained``: each record's trained-token count (None: ``max(tokens - 1, 0)``, no masks),
        at most ``max(tokens - 1, 0)`` each."""
        tok = np.asarray(tokens)
        if tok.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tok.shape}")
        if tok.size and (tok.min() < 0 or tok.max() > np.iinfo(np.uint32).max):
            raise ValueError(f"token counts must fit uint32, got range [{tok.min()}, {tok.max()}]")
        most = np.maximum(tok.astype(np.int64), 1) - 1
        got = most if trained is None else np.asarray(trained)
        if got.shape != tok.shape:
            raise ValueError(f"trained has shape {got.shape}, tokens {tok.shape}")
        if got.size and (got.min() < 0 or (got > most).any()):
            i = int(np.flatnonzero((got < 0) | (got > most))[0])
            raise ValueError(
                f"record {i}: {int(got[i])} trained tokens of {int(tok[i])}; a record trains at "
                "most max(tokens - 1, 0) (position 0 is never a target)"
            )
        first = cost_model.first_overflow(tok)
        if first is not None:
            raise ValueError(f"record {first}: {cost_model.overflow_message(int(tok[first]))}")
        records = np.empty(tok.size, dtype=COST_DTYPE)
        records["tokens"] = tok
        records["cost"] = cost_model.cost(tok)
        records["trained"] = got
        records.flags.writeable = False  # an index is immutable (its hash is cached)
        hashes = None if record_hashes is None else np.asarray(record_hashes, dtype="<u8")
        return cls(records, cost_model, tuple(shards), format, dict(extra or {}), hashes)

    def __len__(self) -> int:
        return len(self.records)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle a mapped index as its file name, not its bytes (spawned workers, ddp_spawn):
        the child maps the same file. An in-memory index pickles its records."""
        fields = (self.cost_model, self.shards, self.format, self.extra, self.record_hashes)
        digest = self._sha256[0] if self._sha256 else None
        stored = self.records if self.source is None else self.source
        return _unpickle, (stored, len(self.records), *fields, digest)

    @property
    def tokens(self) -> npt.NDArray[np.uint32]:
        """Token counts by global record id: a view (of the mapped file when read from disk)."""
        return self.records["tokens"]

    @property
    def trained(self) -> npt.NDArray[np.uint32]:
        """Trained tokens by global record id (mask positions t >= 1, what a per-token mean
        divides by): a view of the stored field; for an index of format 1-3 (no field)
        ``max(tokens - 1, 0)``, computed on each call (4 B/record)."""
        if "trained" in (self.records.dtype.names or ()):
            return self.records["trained"]
        out = (np.maximum(self.records["tokens"], 1) - 1).astype(np.uint32)
        out.flags.writeable = False
        return out

    def trained_of(self, sample_id: int) -> int:
        """One record's trained-token count (no array built for an older index)."""
        if self.has_trained:
            return int(self.records["trained"][sample_id])
        return max(int(self.records["tokens"][sample_id]) - 1, 0)

    @property
    def has_trained(self) -> bool:
        """Whether the trained counts are stored (format 4) rather than derived."""
        return "trained" in (self.records.dtype.names or ())

    @property
    def shard_counts(self) -> list[int]:
        return [s.samples for s in self.shards]

    def costs(self, model: CostModel | None = None) -> npt.NDArray[np.floating[Any]]:
        """Per-record costs, indexable by arrays of global record ids.

        The stored model (``model`` None or equal to it): the float32 ``cost`` column as a view,
        no copy (for a read index, a read-only view of the mapped file). Another model: a new
        read-only float32 array computed from the token counts chunk by chunk (4 B/record of
        private memory, plus ``COST_CHUNK`` records of float64 scratch); callers that plan more
        than once should keep it. Use :meth:`cost_chunks` to stream costs without either.
        """
        if model is None or model == self.cost_model:
            return self.records["cost"]
        out = np.empty(len(self.records), dtype=np.float32)
        for start, chunk in self.cost_chunks(model):
            out[start : start + chunk.size] = chunk
        out.flags.writeable = False
        return out

    def cost_chunks(
        self, model: CostModel | None = None, chunk: int = COST_CHUNK
    ) -> Iterator[tuple[int, npt.NDArray[np.float64]]]:
        """(first record id, float64 costs) of consecutive chunks of ``chunk`` records: the
        stored costs, or recomputed under ``model``. Memory: one chunk at a time."""
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        stored = model is None or model == self.cost_model
        for start in range(0, len(self.records), chunk):
            part = self.records[start : start + chunk]
            if stored:
                yield start, part["cost"].astype(np.float64)
            else:
                assert model is not None
                first = model.first_overflow(part["tokens"])
                if first is not None:
                    n = int(part["tokens"][first])
                    raise CostIndexError(f"record {start + first}: {model.overflow_message(n)}")
                yield start, model.cost(part["tokens"])

    def content_hash(self) -> str:
        """SHA-256 of the records' bytes: ties the JSON to the array it describes.

        Computed once for read-only records (every index read from disk or built here) and
        cached; a read index that was verified at open already holds it.
        """
        if self._sha256:
            return self._sha256[0]
        digest = hashlib.sha256()
        data = np.ascontiguousarray(self.records).view(np.uint8)  # no copy when contiguous
        for start in range(0, data.size, HASH_CHUNK):
            digest.update(data[start : start + HASH_CHUNK].data)
        value = digest.hexdigest()
        if not self.records.flags.writeable:
            self._sha256.append(value)
        return value

    def fingerprint(self) -> str:
        """Short identity of the data (hash + shard layout) for reader states."""
        layout = json.dumps([[s.name, s.samples] for s in self.shards])
        return hashlib.sha256((self.content_hash() + layout).encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        """Statistics stored in the JSON and shown by ``bcl-stream inspect``."""
        return {
            "records": len(self.records),
            "tokens": column_stats(self.records["tokens"]),
            "cost": column_stats(self.records["cost"]),
            "trained": column_stats(self.trained),
        }

    def to_json(self) -> dict[str, Any]:
        """The ``bcl_index.json`` document, sealed (see :mod:`bcl_stream.io.index_meta`)."""
        doc = {
            "format": self.format,
            "records": len(self.records),
            "cost_model": self.cost_model.to_dict(),
            "shards": [{"name": s.name, "samples": s.samples} for s in self.shards],
            "sha256": self.content_hash(),
            "costs_file": COSTS_NPY,
            "record_hashes": None
            if self.record_hashes is None
            else {
                "file": HASHES_NPY,
                "algorithm": RECORD_HASH,
                "sha256": hashlib.sha256(self.record_hashes.view(np.uint8).data).hexdigest(),
            },
            "summary": self.summary(),
            "extra": self.extra,
        }
        return seal(doc)


def current_records(index: CostIndex) -> npt.NDArray[np.void]:
    """``index.records`` in the current ``COST_DTYPE`` (an older index's records gain their
    derived ``trained``): a copy for an old index, the records themselves otherwise."""
    if index.records.dtype == COST_DTYPE:
        return index.records
    out = np.empty(len(index.records), dtype=COST_DTYPE)
    out["tokens"] = index.records["tokens"]
    out["cost"] = index.records["cost"]
    out["trained"] = index.trained
    return out


def write_index(directory: str | os.PathLike[str], index: CostIndex) -> tuple[Path, Path]:
    """Write ``bcl_costs.npy`` then ``bcl_index.json`` into a local directory, atomically each.

    Output: (json path, npy path). Upload both before the format's own index. An index read
    from an older format is written in the current one (:func:`current_records`: its trained
    counts are derived), so the JSON never names a format its array does not have.
    """
    if index.records.dtype != COST_DTYPE:
        upgraded = current_records(index)
        upgraded.flags.writeable = False
        index = replace(index, records=upgraded, source=None)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    npy, meta = root / COSTS_NPY, root / INDEX_JSON
    arrays: list[tuple[str, npt.NDArray[Any]]] = [(COSTS_NPY, index.records)]
    if index.record_hashes is not None:
        arrays.append((HASHES_NPY, index.record_hashes))
    for name, values in arrays:
        tmp_npy = root / (name + ".tmp")
        with open(tmp_npy, "wb") as fh:
            np.save(fh, values, allow_pickle=False)
        os.replace(tmp_npy, root / name)
    tmp_meta = root / (INDEX_JSON + ".tmp")
    tmp_meta.write_text(json.dumps(index.to_json(), indent=1) + "\n")
    os.replace(tmp_meta, meta)
    return meta, npy


def read_index(directory: str | os.PathLike[str], *, verify: bool = True) -> CostIndex:
    """Open and validate a dataset's cost index from a local directory; the array is mapped.

    ``verify`` recomputes the SHA-256 of the array with chunked reads of the file (about 1.4 ms
    per million records at ~700 MB/s) and compares a sample of stored costs with the cost model;
    without it the hash is computed on first use. The JSON's seal is always checked.
    """
    root = Path(directory)
    data = read_index_json(root)
    meta, npy = root / INDEX_JSON, root / COSTS_NPY
    if not npy.is_file():
        raise _fail(npy, "the cost array is missing although bcl_index.json names it")
    records, source, digest = map_npy(npy, verify=verify)
    want = COST_DTYPE if data["format_version"] >= TRAINED_VERSION else COST_DTYPE_V3
    if records.dtype != want:
        raise _fail(
            npy,
            f"cost array has dtype {records.dtype}, but bcl_index.json format "
            f"{data['format_version']} stores {want}",
        )
    if len(records) != data["records"]:
        raise _fail(npy, f"holds {len(records)} records but bcl_index.json says {data['records']}")
    try:
        model = CostModel.from_dict(data["cost_model"])
    except (TypeError, ValueError) as exc:
        raise _fail(meta, f"invalid cost model ({exc})") from exc
    if data["format"] not in FORMATS:
        raise _fail(meta, f"unknown format {data['format']!r}")
    shards = tuple(ShardEntry(s["name"], s["samples"]) for s in data["shards"])
    if sum(s.samples for s in shards) != len(records):
        raise _fail(
            meta,
            f"shard counts sum to {sum(s.samples for s in shards)}, not {len(records)} records",
        )
    extra = data.get("extra") or {}
    index = CostIndex(
        records,
        model,
        shards,
        data["format"],
        extra if isinstance(extra, dict) else {},
        _read_hashes(root, data, len(records), verify),
        source,
    )
    if digest is not None:
        if digest != data["sha256"]:
            raise _fail(
                npy,
                "content hash does not match bcl_index.json (the array was changed or corrupted)",
            )
        index._sha256.append(digest)
        check_costs_follow_model(npy, records, model)
    return index


def _unpickle(
    stored: FileIdentity | npt.NDArray[np.void],
    n_records: int,
    cost_model: CostModel,
    shards: tuple[ShardEntry, ...],
    format: str,
    extra: dict[str, Any],
    record_hashes: npt.NDArray[np.uint64] | None,
    digest: str | None,
) -> CostIndex:
    """Unpickle an index: a mapped one maps the same file again (refusing one replaced
    meanwhile); an in-memory one keeps its records (and its hash cached: they stay read-only)."""
    if isinstance(stored, FileIdentity):
        path = Path(stored.path)
        records, now, _ = map_npy(path, verify=False)
        if now != stored or len(records) != n_records:
            raise _fail(
                path,
                "the file changed after this index was opened in the parent process (replaced "
                "or rewritten); restart the job so every process reads the same index",
            )
        index = CostIndex(records, cost_model, shards, format, extra, record_hashes, stored)
    else:
        if digest is not None:
            stored.flags.writeable = False
        index = CostIndex(stored, cost_model, shards, format, extra, record_hashes)
    if digest is not None:
        index._sha256.append(digest)
    return index


def _read_hashes(
    root: Path, data: dict[str, Any], n_records: int, verify: bool
) -> npt.NDArray[np.uint64] | None:
    """The per-record hashes ``bcl_index.json`` names (None when it names none)."""
    named = data.get("record_hashes")
    if named is None:
        return None
    path = root / HASHES_NPY
    if not path.is_file():
        raise _fail(path, "the record hashes are missing although bcl_index.json names them")
    try:  # mapped first: a header's shape is checked before anything is allocated for it
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # numpy parses the header with ast/tokenize: many error types
        raise _fail(path, f"unreadable record hashes ({exc})") from exc
    if mapped.dtype != np.dtype("<u8") or mapped.shape != (n_records,):
        raise _fail(
            path, f"holds {mapped.dtype} {mapped.shape}, expected uint64 ({n_records},) hashes"
        )
    hashes = np.array(mapped)
    del mapped
    if verify and hashlib.sha256(hashes.view(np.uint8).data).hexdigest() != named["sha256"]:
        raise _fail(path, "SHA-256 does not match bcl_index.json (changed or corrupted)")
    return hashes
