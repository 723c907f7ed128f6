"""A dataset on local disk as a whole: is it complete, do its shards match its cost index?

Readers, ``annotate`` and ``inspect`` all need the same answers before they touch a payload,
so they live here, with no streaming or webdataset import (both are slow to import and neither
is needed to read a tar header or ``index.json``). The layout facts these checks build on (file
names, format detection, MDS ``index.json``) are :mod:`bcl_stream.io.dataset_dir`'s.

Counting WDS records needs the tar headers only: :func:`tar_record_counts` walks them with
:mod:`bcl_stream.formats.tar_scan` (the one tar reader, which seeks over member payloads of an
uncompressed tar), so checking a 1 GB shard reads a few hundred kB.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.integrity import mds_record_problem, mds_shard_problem
from bcl_stream.formats.tar_scan import TAR_ERRORS, split_member, tar_members, tar_records
from bcl_stream.io.dataset_dir import (
    POINTER_KEY,
    Format,
    detect_format,
    incomplete,
    mds_shard_entries,
    peek_index_json,
    read_mds_index,
    wds_shards_on_disk,
)
from bcl_stream.io.hashing import record_digest
from bcl_stream.io.index import COSTS_NPY, INDEX_JSON, CostIndex, ShardEntry, read_index

_UINT32 = np.dtype(np.uint32)


def tar_record_counts(path: Path) -> int:
    """Records in one WebDataset tar: distinct keys (member name up to the first dot), from
    the member headers alone (payloads are skipped, never read)."""
    try:
        return len({split_member(name)[0] for name, _ in tar_members(path)})
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{path}: unreadable tar shard ({exc}); re-download or rewrite the shard"
        ) from exc


def _mds_problems(root: Path, index: CostIndex) -> list[str]:
    problems: list[str] = []
    try:
        data = read_mds_index(root)
        actual = mds_shard_entries(root)
    except DatasetError as exc:
        return [str(exc)]
    if [s.name for s in actual] != [s.name for s in index.shards]:
        problems.append(
            f"shard list differs: index.json has {len(actual)} shards, "
            f"{INDEX_JSON} has {len(index.shards)} (first names {actual[:1]} vs {index.shards[:1]})"
        )
    for got, want in zip(actual, index.shards, strict=False):
        if got.name == want.name and got.samples != want.samples:
            problems.append(
                f"shard {got.name}: index.json says {got.samples} samples, "
                f"{INDEX_JSON} says {want.samples}"
            )
    # Every shard checked as the MDS reader checks it before its first read: present, its size
    # as index.json records it (a truncated copy), its header, its content hash, and each
    # record's hash when the cost index holds them (annotate).
    hashes = index.record_hashes
    layout_ok = [s.samples for s in actual] == index.shard_counts
    first = 0
    for shard in data["shards"]:
        first += int(shard.get("samples", 0))
        names = [shard.get(k, {}).get("basename") for k in ("raw_data", "zip_data") if shard.get(k)]
        if not any((root / n).is_file() for n in names if n):
            problems.append(f"shard file missing: {' or '.join(str(n) for n in names)}")
            continue
        problem = mds_shard_problem(root, shard)
        if problem is None and hashes is not None and layout_ok:
            problem = mds_record_problem(root, shard, first - int(shard["samples"]), hashes)
        if problem:
            problems.append(f"damaged shard: {problem}")
    if data.get(POINTER_KEY) not in (None, INDEX_JSON):
        problems.append(f"index.json points to {data.get(POINTER_KEY)!r}, expected {INDEX_JSON!r}")
    return problems


def wds_record_problems(path: Path, first: int, hashes: np.ndarray) -> list[str]:
    """Records of one tar whose members differ from their hash in the cost index.

    Reads every payload of the shard once (``inspect``); readers check only what they read.
    """
    problems: list[str] = []
    try:
        for sample, (key, members) in enumerate(tar_records(path), start=first):
            if sample < hashes.size and record_digest(members) != hashes[sample]:
                problems.append(
                    f"{path.name}: record {sample} (key {key!r}): xxh64 content hash differs "
                    "from the cost index (corrupted bytes)"
                )
    except TAR_ERRORS as exc:
        problems.append(f"{path.name}: unreadable tar shard ({exc})")
    return problems


def _wds_problems(root: Path, index: CostIndex) -> list[str]:
    problems: list[str] = []
    on_disk = set(wds_shards_on_disk(root))
    first = 0
    for shard in index.shards:
        first += shard.samples
        if index.record_hashes is not None and (root / shard.name).is_file():
            problems += wds_record_problems(
                root / shard.name, first - shard.samples, index.record_hashes
            )[:5]
        path = root / shard.name
        if not path.is_file():
            problems.append(f"shard file missing: {shard.name}")
            continue
        try:
            count = tar_record_counts(path)
        except DatasetError as exc:
            problems.append(str(exc))
            continue
        if count != shard.samples:
            problems.append(
                f"shard {shard.name}: holds {count} records, {INDEX_JSON} says {shard.samples}"
            )
    extra = sorted(on_disk - {s.name for s in index.shards})
    if extra:
        problems.append(f"shards not in {INDEX_JSON}: {', '.join(extra[:5])}")
    return problems


def check_integrity(local_dir: str | os.PathLike[str], index: CostIndex) -> list[str]:
    """Problems (empty if none) between a cost index and the shards on disk.

    Checks the index's hash against ``bcl_index.json`` when that file is present, the format,
    the shard list and per-shard record counts (MDS: ``index.json`` counts, and every shard file
    as the reader checks it: present, its recorded size, header and content hash; WDS: tar
    member keys counted per shard, and every record against its hash when the index has
    record hashes).
    """
    root = Path(local_dir)
    problems: list[str] = []
    try:
        fmt = detect_format(root)
    except DatasetError as exc:
        return [str(exc)]
    if fmt != index.format:
        problems.append(f"the cost index is for {index.format}, the directory holds {fmt}")
    if (root / INDEX_JSON).is_file():
        stored = peek_index_json(root, "sha256")
        if stored != index.content_hash():
            problems.append(
                f"{INDEX_JSON} hash {str(stored)[:12]} does not match the cost array "
                f"({index.content_hash()[:12]}): {COSTS_NPY} was changed or replaced"
            )
    problems += _mds_problems(root, index) if fmt == "mds" else _wds_problems(root, index)
    return problems


def integrity_checks(local_dir: str | os.PathLike[str], index: CostIndex) -> dict[str, Any]:
    """Which checks :func:`check_integrity` runs on this dataset, said plainly (``inspect``
    reports it): ``checked`` (what is compared), ``content_hash`` (which hash covers the
    payload bytes, or None) and, when none does, ``not_detectable``: what damage would pass
    unseen and how to add hashes. Nothing is claimed that did not run."""
    root = Path(local_dir)
    if index.format == "wds":
        checked = ["each tar's headers", "record count per shard"]
        if index.record_hashes is not None:
            return {
                "checked": checked,
                "content_hash": "xxh64 of every record's members (bcl_hashes.npy)",
                "not_detectable": None,
            }
        return {
            "checked": checked,
            "content_hash": None,
            "not_detectable": _NO_HASH.format(root=root, what="a WebDataset record"),
        }
    checked = ["every shard's size", "header and offset table", "record count per shard"]
    if index.record_hashes is not None:
        return {
            "checked": checked,
            "content_hash": "xxh64 of every record's bytes (bcl_hashes.npy, from annotate)",
            "not_detectable": None,
        }
    try:
        entries = read_mds_index(root)["shards"]
    except DatasetError:
        entries = []
    algos = sorted({a for e in entries for a in (_info(e).get("hashes") or {})})
    hashed = sum(1 for e in entries if _info(e).get("hashes"))
    if entries and hashed == len(entries):
        return {
            "checked": checked,
            "content_hash": f"{'/'.join(algos)} of every shard (index.json)",
            "not_detectable": None,
        }
    return {
        "checked": checked,
        "content_hash": None
        if not hashed
        else f"{'/'.join(algos)} of {hashed} of {len(entries)} shards (index.json)",
        "not_detectable": _NO_HASH.format(root=root, what="an MDS record"),
    }


_NO_HASH = (
    "no content hash covers every record: a flipped payload byte in {what} is not detectable "
    "(it would be trained silently); add record hashes with `bcl-stream annotate --overwrite "
    "{root}` (with the options the cost index was made with), shards untouched"
)


def _info(entry: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = entry.get("zip_data") or entry.get("raw_data") or {}
    return info


@dataclass(frozen=True, slots=True)
class FileLayout:
    """A complete, costed local dataset: where, which format, its cost index."""

    root: Path
    format: Format
    index: CostIndex

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return self.index.shards


def open_file_layout(
    local_dir: str | os.PathLike[str], *, verify: bool = True, check: bool = False
) -> FileLayout:
    """Open a finished dataset, refusing incomplete ones with a :class:`DatasetError`.

    ``verify`` rechecks the cost array's hash; ``check`` also runs :func:`check_integrity`
    (reads every tar header for WDS) and raises on the first problems found.
    """
    root = Path(local_dir)
    fmt = detect_format(root)
    if fmt == "mds":
        read_mds_index(root)  # raises "incomplete" without index.json
    elif not (root / INDEX_JSON).is_file():
        raise incomplete(
            root,
            f"tar shards but no {INDEX_JSON} (if this WebDataset was written by another tool, "
            f"run `bcl-stream annotate {root}` instead)",
        )
    try:
        index = read_index(root, verify=verify)
    except CostIndexError as exc:
        if not (root / INDEX_JSON).is_file():
            raise CostIndexError(
                f"{root}: complete MDS dataset without a cost index; "
                f"run `bcl-stream annotate {root}`"
            ) from exc
        raise
    if check:
        problems = check_integrity(root, index)
        if problems:
            raise DatasetError(
                f"{root}: cost index does not match the shards: {'; '.join(problems[:5])}. "
                f"Re-run `bcl-stream annotate {root}` or preprocess with --overwrite."
            )
    return FileLayout(root, fmt, index)


def as_token_array(value: Any, where: str | int) -> np.ndarray:
    """``value`` as a 1-D uint32 array, refusing silent wrap-around of ids outside uint32."""
    if type(value) is np.ndarray and value.dtype == _UINT32 and value.ndim == 1:
        return value  # the common case, kept to a few attribute reads per record
    where = f"record {where}" if isinstance(where, int) else where
    arr = np.asarray(value)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(
            f"{where}: input_ids must be a 1-D integer array, got {arr.dtype} {arr.shape}"
        )
    if arr.dtype != np.uint32:
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.uint32).max):
            raise ValueError(f"{where}: token ids outside uint32 range [{arr.min()}, {arr.max()}]")
        arr = arr.astype(np.uint32)
    return arr
