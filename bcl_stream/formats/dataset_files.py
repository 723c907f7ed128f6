"""Dataset layout on local disk: which format, which shards, how many records each, complete?

Readers, ``annotate`` and ``inspect`` all need the same three answers before they touch a
payload, so they live here, with no streaming or webdataset import (both are slow to import
and neither is needed to read a tar header or ``index.json``).

Completion markers, in the order writers produce them:

- MDS: shards, then ``bcl_costs.npy`` + ``bcl_index.json``, then ``index.json`` last (stock
  readers take ``index.json`` as "dataset complete"). ``index.json`` carries one top-level
  pointer key, ``"bcl_index": "bcl_index.json"``.
- WebDataset: shards (``*.tar``), then ``bcl_costs.npy``, then ``bcl_index.json`` last: for WDS
  our index is the shard list, so its absence means the write did not finish (or the dataset
  was written by someone else and needs ``bcl-stream annotate``).

Counting WDS records needs the tar headers only: :func:`tar_record_counts` walks them with
:mod:`bcl_stream.formats.tar_scan` (the one tar reader, which seeks over member payloads of an
uncompressed tar), so checking a 1 GB shard reads a few hundred kB.

MDS ``index.json`` is written by :func:`write_mds_index` only, and our shard list is built from
its entries by :func:`shard_entries` only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.tar_scan import TAR_ERRORS, split_member, tar_members, tar_records
from bcl_stream.io.index import COSTS_NPY, INDEX_JSON, CostIndex, ShardEntry, read_index

MDS_INDEX = "index.json"
MDS_INDEX_VERSION = 2
"""The ``version`` streaming's MDS writer puts in ``index.json``."""
POINTER_KEY = "bcl_index"
"""The one top-level key we add to MDS ``index.json`` (stock readers ignore top-level extras)."""
WDS_SUFFIXES = (".tar", ".tar.gz", ".tgz")

Format = Literal["mds", "wds"]
_UINT32 = np.dtype(np.uint32)


def _incomplete(root: Path, what: str) -> DatasetError:
    return DatasetError(
        f"incomplete dataset: {root}: {what}. The write was interrupted or is still running; "
        "re-run preprocess with --overwrite."
    )


def wds_shards_on_disk(root: Path) -> list[str]:
    """Tar shard names in ``root`` (sorted: the order ``ShardWriter``'s numbering gives)."""
    return sorted(p.name for p in root.iterdir() if p.is_file() and p.name.endswith(WDS_SUFFIXES))


def _peek_index_json(root: Path, key: str) -> Any:
    """One top-level value of ``root``'s ``bcl_index.json``, or None when the file is missing,
    unreadable or not a JSON object.

    Why not ``read_index_json``: detecting the format and checking the stored hash only peek at
    one field and must not raise on a damaged file; reading the index proper reports what is
    wrong with it, naming the file.
    """
    try:
        return json.loads((root / INDEX_JSON).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def detect_format(local_dir: str | os.PathLike[str]) -> Format:
    """``"mds"`` or ``"wds"`` for a local dataset directory.

    Our ``bcl_index.json`` decides when present; otherwise ``index.json`` means MDS and tar
    files mean WebDataset. Anything else is a :class:`DatasetError`.
    """
    root = Path(local_dir)
    if not root.is_dir():
        from bcl_stream.io.remote import not_a_directory

        raise not_a_directory(root)
    if not any(root.iterdir()):
        raise DatasetError(
            f"{root}: an empty directory, not a dataset (nothing was written there: a run that "
            "failed before its first shard, or the wrong path)"
        )
    fmt = _peek_index_json(root, "format")
    if fmt in ("mds", "wds"):
        return "mds" if fmt == "mds" else "wds"
    if (root / MDS_INDEX).is_file() or any(".mds" in p.name for p in root.iterdir()):
        return "mds"
    if wds_shards_on_disk(root):
        return "wds"
    raise DatasetError(
        f"{root}: not a dataset (no index.json, no .mds shards, no .tar shards). "
        "Point at the directory that preprocess wrote."
    )


def read_mds_index(root: Path) -> dict[str, Any]:
    """Parsed MDS ``index.json``; a missing one means the write never finished."""
    path = root / MDS_INDEX
    if not path.is_file():
        raise _incomplete(root, "MDS shards but no index.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"{path}: unreadable index.json ({exc}); re-run preprocess with --overwrite"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise DatasetError(f"{path}: not an MDS index (no 'shards' list)")
    return data


def shard_entries(
    shards: Sequence[Mapping[str, Any]], where: str | os.PathLike[str]
) -> list[ShardEntry]:
    """Our shard list from MDS ``index.json`` shard entries (the ``shards`` list streaming's
    writer keeps and writes): the raw basename as the name, the sample count. ``where`` names
    the source in the error a malformed entry raises."""
    entries = []
    for i, shard in enumerate(shards):
        try:
            entries.append(ShardEntry(shard["raw_data"]["basename"], int(shard["samples"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: shard entry {i} is malformed") from exc
    return entries


def mds_shard_entries(root: Path) -> list[ShardEntry]:
    """Shards and sample counts as MDS ``index.json`` lists them (raw basename as the name)."""
    return shard_entries(read_mds_index(root)["shards"], root / MDS_INDEX)


def write_mds_index(root: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write MDS ``index.json`` into ``root``, atomically, with our pointer key; output: its path.

    ``data``: the index's other keys (``version``, ``shards``, any top-level extras), kept as
    given. The only writer of ``index.json`` (the costed writer's ending, ``annotate``): the
    file is the "dataset complete" marker, so it is replaced in one rename, never half written.
    """
    path = Path(root) / MDS_INDEX
    tmp = path.with_name(MDS_INDEX + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({**data, POINTER_KEY: INDEX_JSON}, fh, sort_keys=True)
    os.replace(tmp, path)
    return path


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
    # as index.json records it (a truncated copy), its header, and its content hash.
    from bcl_stream.io.integrity import mds_shard_problem

    for shard in data["shards"]:
        names = [shard.get(k, {}).get("basename") for k in ("raw_data", "zip_data") if shard.get(k)]
        if not any((root / n).is_file() for n in names if n):
            problems.append(f"shard file missing: {' or '.join(str(n) for n in names)}")
            continue
        problem = mds_shard_problem(root, shard)
        if problem:
            problems.append(f"damaged shard: {problem}")
    if data.get(POINTER_KEY) not in (None, INDEX_JSON):
        problems.append(f"index.json points to {data.get(POINTER_KEY)!r}, expected {INDEX_JSON!r}")
    return problems


def wds_record_problems(path: Path, first: int, hashes: np.ndarray) -> list[str]:
    """Records of one tar whose members differ from their hash in the cost index.

    Reads every payload of the shard once (``inspect``); readers check only what they read.
    """
    from bcl_stream.io.hashing import record_digest

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
        stored = _peek_index_json(root, "sha256")
        if stored != index.content_hash():
            problems.append(
                f"{INDEX_JSON} hash {str(stored)[:12]} does not match the cost array "
                f"({index.content_hash()[:12]}): {COSTS_NPY} was changed or replaced"
            )
    problems += _mds_problems(root, index) if fmt == "mds" else _wds_problems(root, index)
    return problems


@dataclass(frozen=True, slots=True)
class Layout:
    """A complete, costed local dataset: where, which format, its cost index."""

    root: Path
    format: Format
    index: CostIndex

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return self.index.shards


def open_layout(
    local_dir: str | os.PathLike[str], *, verify: bool = True, check: bool = False
) -> Layout:
    """Open a finished dataset, refusing incomplete ones with a :class:`DatasetError`.

    ``verify`` rechecks the cost array's hash; ``check`` also runs :func:`check_integrity`
    (reads every tar header for WDS) and raises on the first problems found.
    """
    root = Path(local_dir)
    fmt = detect_format(root)
    if fmt == "mds":
        read_mds_index(root)  # raises "incomplete" without index.json
    elif not (root / INDEX_JSON).is_file():
        raise _incomplete(
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
    return Layout(root, fmt, index)


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
