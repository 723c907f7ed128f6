"""WebDataset reader: composable generator stages plus a ready plan-following dataset.

Stages (typed, ``def stage(src, ...)`` style, usable inside a stock ``wds.DataPipeline``):

- :func:`tar_samples`: shards -> (record id, raw members) read sequentially. A record the plan
  does not need is skipped from its tar header alone: the payload is neither decoded nor read
  (``tar_scan`` seeks over it), which is what makes resume and other ranks' records cheap.
- :func:`decode_sample`: raw members -> a record dict (``input_ids`` as numpy, ``loss_spans``
  as numpy uint32 where stored, ``json`` parsed).
- :func:`follow_plan` / :func:`bcl_packs`: samples -> packs of exactly B records, in plan order,
  held in a bounded buffer. ``bcl_packs`` computes the rank-local BCL plan itself from the cost
  index, so every rank yields the same number of packs without talking to the others. Samples
  written by ``CostedWDSWriter`` carry their global id as ``__key__``, so ``bcl_packs`` also works
  after stock ``wds.tarfile_to_samples() + wds.decode()``.

The dataset (:class:`WDSPackDataset`, every scope) does not stream the tars: it reads each
record by byte range from the tar's member index (:mod:`bcl_stream.formats.wds_shards`,
scanned once per tar and node), so a rank reads exactly its own records of its node's shards,
in plan order, with nothing buffered beyond the pack being read. The sequential stages above
stay for stock pipelines (``bcl_packs`` after ``wds.tarfile_to_samples()``), where the buffer
holds records needed later than the current pack: feed the shards in ``shard_order``.

Workers: worker w of K yields the items w, w+K, ... (``reader_base``) and reads only their
records; the node's processes share the member indexes and the downloads.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import warnings
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.epoch.plan import ReaderConfig, Segment, reader_plan
from bcl_stream.errors import DatasetError
from bcl_stream.formats.npy import load_npy
from bcl_stream.formats.reader_base import DatasetReader, Pack, Record
from bcl_stream.formats.tar_scan import TarFormatError, tar_members
from bcl_stream.formats.wds_shards import ShardCache, member_index_dir
from bcl_stream.io.hashing import record_digest
from bcl_stream.io.index import CostIndex
from bcl_stream.io.remote import remote_sizes
from bcl_stream.records.registry import record_ids
from bcl_stream.text.loss_spans import LOSS_SPANS, check_record_spans

Raw = dict[str, bytes]


def _split_name(fname: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the name up to the first dot (in the base name)."""
    directory, base = os.path.split(fname)
    key, _, suffix = base.partition(".")
    return os.path.join(directory, key), suffix.lower()


PART_KEY = re.compile(r"^part-(\d+)-of-\d+-(\d+)$")
"""Keys of a part of a partitioned run (``CostedWDSWriter(key_prefix=...)``)."""


def part_firsts(index: CostIndex) -> tuple[int, ...]:
    """First global record id of each part of a merged dataset (empty for any other)."""
    merged = index.extra.get("merge")
    if not isinstance(merged, dict) or merged.get("kind") != "preprocess":
        return ()
    return tuple(int(p["first"]) for p in merged.get("parts", ()))


def key_sample_id(key: str, firsts: Sequence[int] = ()) -> int | None:
    """The global record id a record key stands for: a plain id (``0000000042``), or in a
    merged dataset ``part-I-of-N-<id in part I>`` (with ``firsts`` from :func:`part_firsts`;
    without, the id inside the part: a part read on its own). None: not one of ours."""
    base = os.path.basename(key)
    if base.isdigit():
        return int(base)
    match = PART_KEY.match(base)
    if match is None:
        return None
    part, local = int(match[1]), int(match[2])
    if not firsts:
        return local
    return firsts[part] + local if part < len(firsts) else None


def tar_samples(
    shards: Iterable[tuple[str, Path, int, int]],
    wanted: Container[int],
    hashes: npt.NDArray[np.uint64] | None = None,
    firsts: Sequence[int] = (),
) -> Iterator[tuple[int, str, Raw]]:
    """Shards (name, local path, first record id, record count) -> (record id, key, members)
    for the records in ``wanted``; the others are skipped without reading their payload.

    ``hashes`` (per global record id, from the cost index): each wanted record's members are
    checked against it before the record is yielded; a mismatch is a DatasetError naming the
    shard and the record. ``firsts``: see :func:`key_sample_id`.
    """
    for name, path, first, count in shards:
        ordinal = -1
        key: str | None = None
        members: Raw = {}
        try:
            for member_name, read in tar_members(path):
                member_key, suffix = _split_name(member_name)
                if member_key != key:
                    if key is not None and first + ordinal in wanted:
                        _check_hash(name, first + ordinal, key, members, hashes)
                        yield first + ordinal, key, members
                    key, ordinal, members = member_key, ordinal + 1, {}
                    _check_key(name, key, first + ordinal, firsts)
                if first + ordinal in wanted:
                    members[suffix] = read()
            if key is not None and first + ordinal in wanted:
                _check_hash(name, first + ordinal, key, members, hashes)
                yield first + ordinal, key, members
        except (tarfile.TarError, TarFormatError, OSError, EOFError) as exc:
            raise DatasetError(
                f"{name}: unreadable tar shard ({type(exc).__name__}: {exc}) at record "
                f"{first + max(ordinal, 0)}. Re-download or rewrite the shard."
            ) from exc
        if ordinal + 1 != count:
            raise DatasetError(
                f"{name}: holds {ordinal + 1} records but the cost index says {count}. The shard "
                "was changed after the cost index was written: rebuild it with `bcl-stream annotate`."
            )


def _check_hash(
    shard: str, sample_id: int, key: str, members: Raw, hashes: npt.NDArray[np.uint64] | None
) -> None:
    if hashes is None or sample_id >= hashes.size:
        return  # a record beyond the index is reported by the record count check
    if record_digest(members.items()) != int(hashes[sample_id]):
        raise DatasetError(
            f"{shard}: record {sample_id} (key {os.path.basename(key)!r}): xxh64 content hash "
            "differs from the cost index (corrupted bytes). Re-download or re-copy the shard "
            "(for a remote dataset, delete its local cache copy), then resume from the last "
            "checkpoint."
        )


def _check_key(shard: str, key: str, sample_id: int, firsts: Sequence[int]) -> None:
    base = os.path.basename(key)
    stands_for = key_sample_id(base, firsts)
    if stands_for is not None and stands_for != sample_id:
        raise DatasetError(
            f"{shard}: record key {base!r} is not the expected global record id {sample_id}; "
            "the shard order differs from the cost index (shards renamed or reordered?). If "
            "the keys are numbered names from another tool (a filtered corpus keeps its gaps), "
            "re-run `bcl-stream annotate --overwrite`: it records that the keys are not ids."
        )


def decode_sample(sample_id: int, key: str, members: Raw) -> Record:
    """Raw tar members -> ``{"sample_id", "__key__", "input_ids": ndarray, "json": dict, ...}``."""
    out: Record = {"sample_id": sample_id, "__key__": key}
    for suffix, data in members.items():
        try:
            if suffix.endswith("npy"):
                out[suffix[: -len(".npy")] or "npy"] = load_npy(data)
            elif suffix == "json" or suffix.endswith(".json"):
                out[suffix] = json.loads(data)
            elif suffix in ("txt", "text") or suffix.endswith(".txt"):
                out[suffix] = data.decode("utf-8")
            else:
                out[suffix] = data
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            raise DatasetError(
                f"record {sample_id} (key {key!r}): member .{suffix} cannot be decoded "
                f"({type(exc).__name__}: {exc}). Rewrite the record or drop it at preprocessing."
            ) from exc
    return out


def _sample_id(sample: Record, firsts: Sequence[int]) -> int:
    if "sample_id" in sample:
        return int(sample["sample_id"])
    sid = key_sample_id(str(sample.get("__key__", "")), firsts)
    if sid is None:
        raise DatasetError(
            f"sample with key {sample.get('__key__')!r} has no 'sample_id' and its key is not a "
            "global record id; write the dataset with CostedWDSWriter or add record ids upstream."
        )
    return sid


def follow_plan(
    src: Iterable[Record], packs: npt.NDArray[np.int64], firsts: Sequence[int] = ()
) -> Iterator[Pack]:
    """Samples (any order) -> the rows of ``packs`` as lists of samples, in row order.

    A sample waits in the buffer until its pack is next and complete; samples no pack needs
    are dropped. If ``src`` ends before every pack is complete, a DatasetError names the
    missing records.
    """
    rows = [[sid for sid in ids if sid >= 0] for ids in packs.tolist()]  # tokens: -1 padding
    slot: dict[int, int] = {sid: row for row, ids in enumerate(rows) for sid in ids}
    buffer: dict[int, Record] = {}
    row = 0
    n_rows = len(rows)
    for sample in src:
        if row >= n_rows:
            return
        sid = _sample_id(sample, firsts)
        if sid not in slot:
            continue
        buffer[sid] = sample
        while row < n_rows and all(i in buffer for i in rows[row]):
            yield [buffer.pop(i) for i in rows[row]]
            row += 1
    if row < n_rows:
        missing = [i for r in rows[row:] for i in r if i not in buffer]
        raise DatasetError(
            f"the shards ended before pack {row} of {n_rows}: {len(missing)} planned records "
            f"never arrived (first: {missing[:5]}). The shards do not match the cost index."
        )


def bcl_packs(
    src: Iterable[Record],
    *,
    index: CostIndex,
    config: ReaderConfig,
    rank: int,
    epoch: int = 0,
    start: int = 0,
    step: int = 1,
    segments: tuple[Segment, ...] = (),
) -> Iterator[Pack]:
    """Pipeline stage: rank ``rank``'s balanced packs of ``epoch`` (packs start, start+step, ...)."""
    if index.extra.get("record_keys") == "names":
        raise DatasetError(
            "the cost index says this WebDataset's record keys are names, not record ids (a "
            "stock corpus whose numbered keys have gaps): a webdataset pipeline stage cannot tell "
            "which record a sample is. Read it with WDSPackDataset (or the DataModule), which "
            "counts records in shard order"
        )
    packs = reader_plan(index, config, epoch, segments).rank_packs(rank)
    return follow_plan(src, packs[start::step], part_firsts(index))


_WARNED: set[str] = set()


def _warn_unhashed(location: str) -> None:
    """Say once per dataset and process that its records go unchecked (index format 1)."""
    if location in _WARNED:
        return
    _WARNED.add(location)
    warnings.warn(
        f"{location}: the cost index has no record hashes (bcl_index.json format 1): a flipped "
        "byte inside a WebDataset record will NOT be detected. Add them with "
        f"`bcl-stream annotate --overwrite {location}` (the shards are not rewritten).",
        UserWarning,
        stacklevel=3,
    )


class WDSPackDataset(DatasetReader):
    """One rank's packs of a costed WebDataset dataset (local directory or ``s3://``), in any
    scope: records are read by byte range from each shard's member index
    (:mod:`bcl_stream.formats.wds_shards`), so a rank reads exactly its own records, from any
    shard of its node, in plan order, with no buffer beyond the pack being read.

    Remote shards are downloaded to ``cache_dir`` (the node's shared cache: one per node, a
    lock per shard), up to ``options.prefetch`` shards ahead of the one being read, and kept
    there; ``options`` (:class:`~bcl_stream.formats.read_options.ReadOptions`) also sets each
    download's timeout and a ``cache_limit`` above which the tars this process downloaded are
    deleted oldest first.
    """

    format = "wds"

    def _open_format(
        self, index: CostIndex, cache_dir: str | os.PathLike[str] | None, **unknown: Any
    ) -> None:
        if unknown:
            raise TypeError(
                f"WDSPackDataset takes no keyword arguments {sorted(unknown)} (the MDS reader "
                "passes its extra keywords to StreamingDataset; this reader has none)"
            )
        if index.record_hashes is None:
            _warn_unhashed(self.location)
        firsts = part_firsts(index)
        names = index.extra.get("record_keys") == "names"  # annotate: keys are not record ids
        self.shards = ShardCache(
            self.location,
            self.root,
            index,
            self.options,
            remote=self.remote,
            keep=self.config.plan.shard_group + self.options.prefetch + 1,
            check_key=_KeyCheck(tuple(firsts), names),
            index_dir=member_index_dir(self.location, self.root, cache_dir),
        )
        if self.remote and self.options.cache_bytes is not None:
            self._check_cache_fit(remote_sizes(self.location, [e.name for e in index.shards]))

    def shard_order(self, packs: npt.NDArray[np.int64]) -> list[int]:
        """Shards holding the packs' records, in the order the packs first need them."""
        return _first_needed(self.shards.shard_of(packs.ravel()))

    def _read_packs(self, packs: npt.NDArray[np.int64]) -> Iterator[Pack]:
        shards = self.shards
        hashes = self.index.record_hashes
        starts = shards.starts
        shard_of = shards.shard_of(packs.ravel())  # one lookup per record, for both uses
        shard_rows = shard_of.reshape(packs.shape)
        order = _first_needed(shard_of)
        position = {s: i for i, s in enumerate(order)}
        where = f"{self.location}: record"
        reached = -1
        for ids, row in zip(packs.tolist(), shard_rows.tolist(), strict=True):
            last = max(position[s] for s in row)
            if last > reached:  # new shards: fetch them (and the next ones) in parallel
                shards.prefetch(order[reached + 1 :], now=last - reached)
                reached = last
            pack: Pack = []
            for sid, s in zip(ids, row, strict=True):
                records = shards.records(s)
                i = sid - int(starts[s])
                members = records.raw(i)
                key = records.key(i)
                _check_hash(records.name, sid, key, members, hashes)
                record = decode_sample(sid, key, members)
                record = record_ids(record, self.tokens, f"{where} {sid}")
                if LOSS_SPANS in record:  # a stored mask must train what the index says
                    check_record_spans(record, self.index.trained_of(sid), f"{where} {sid}")
                pack.append(record)
            yield pack


def _first_needed(shard_of: npt.NDArray[np.int64]) -> list[int]:
    """The distinct shards of ``shard_of`` (each record's shard, in pack order), in the order
    of their first record."""
    first = np.unique(shard_of, return_index=True)[1]
    return [int(s) for s in shard_of[np.sort(first)]]


@dataclass(frozen=True, slots=True)
class _KeyCheck:
    """:func:`_check_key` with a dataset's part offsets (picklable, for worker processes)."""

    firsts: tuple[int, ...]
    names: bool = False
    """The cost index says the keys are names, not record ids (``annotate`` of a stock
    WebDataset whose numbered keys have gaps): nothing to check them against."""

    def __call__(self, shard: str, key: str, sample_id: int) -> None:
        if not self.names:
            _check_key(shard, key, sample_id, self.firsts)
