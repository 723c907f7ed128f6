"""What a dataset directory holds, before any payload is read: the file names and shard
suffixes of both formats, which format a directory is, and MDS ``index.json`` (read, write,
our shard list from its entries).

The bottom of the dataset layer: :mod:`bcl_stream.io` (remote fetches, the cost index) and
:mod:`bcl_stream.formats` (readers, writers, integrity checks) both import these facts from
here, so neither needs the other for them. Nothing here imports streaming or webdataset.

Completion markers, in the order writers produce them:

- MDS: shards, then ``bcl_costs.npy`` + ``bcl_index.json``, then ``index.json`` last (stock
  readers take ``index.json`` as "dataset complete"). ``index.json`` carries one top-level
  pointer key, ``"bcl_index": "bcl_index.json"``.
- WebDataset: shards (``*.tar``), then ``bcl_costs.npy``, then ``bcl_index.json`` last: for WDS
  our index is the shard list, so its absence means the write did not finish (or the dataset
  was written by someone else and needs ``bcl-stream annotate``).

MDS ``index.json`` is written by :func:`write_mds_index` only, and our shard list is built from
its entries by :func:`shard_entries` only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from bcl_stream.errors import DatasetError
from bcl_stream.io.index import INDEX_JSON, ShardEntry
from bcl_stream.io.names import check_name

MDS_INDEX = "index.json"
MDS_INDEX_VERSION = 2
"""The ``version`` streaming's MDS writer puts in ``index.json``."""
POINTER_KEY = "bcl_index"
"""The one top-level key we add to MDS ``index.json`` (stock readers ignore top-level extras)."""
WDS_SUFFIXES = (".tar", ".tar.gz", ".tgz")

Format = Literal["mds", "wds"]


def incomplete(root: Path, what: str) -> DatasetError:
    """The error for a dataset whose completion marker is missing (``what`` says which)."""
    return DatasetError(
        f"incomplete dataset: {root}: {what}. The write was interrupted or is still running; "
        "re-run preprocess with --overwrite."
    )


def wds_shards_on_disk(root: Path) -> list[str]:
    """Tar shard names in ``root`` (sorted: the order ``ShardWriter``'s numbering gives)."""
    return sorted(p.name for p in root.iterdir() if p.is_file() and p.name.endswith(WDS_SUFFIXES))


def peek_index_json(root: Path, key: str) -> Any:
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
        raise not_a_directory(root)
    if not any(root.iterdir()):
        raise DatasetError(
            f"{root}: an empty directory, not a dataset (nothing was written there: a run that "
            "failed before its first shard, or the wrong path)"
        )
    fmt = peek_index_json(root, "format")
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
        raise incomplete(root, "MDS shards but no index.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"{path}: unreadable index.json ({exc}); re-run preprocess with --overwrite"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise DatasetError(f"{path}: not an MDS index (no 'shards' list)")
    check_mds_entries(data["shards"], path)
    return data


MAX_BYTES = 1 << 48
"""Largest shard size an ``index.json`` entry may state (256 TiB; streaming keeps sizes in
int64 arrays, and a real shard is megabytes)."""
FIX = (
    ". index.json was damaged or written by another tool: re-run preprocess with --overwrite, "
    "or ask whoever supplies the dataset"
)


def check_mds_entries(shards: Sequence[Any], where: str | os.PathLike[str]) -> None:
    """Refuse MDS ``index.json`` shard entries whose file names are unsafe (absolute, ``..``:
    :func:`bcl_stream.io.names.check_name`), whose sample count or byte size is no whole
    number in range, whose hashes are no mapping of names, or whose version is not the one
    streaming reads (it asserts on it), naming the entry. Called on every ``index.json``
    before anything (streaming included) builds a path from it or sizes an array by it."""
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise DatasetError(f"{where}: shard entry {i} is not an object: {str(shard)[:100]}")
        for key in ("raw_data", "zip_data"):
            info = shard.get(key)
            if info is None and key == "zip_data":
                continue
            if not isinstance(info, dict):
                raise DatasetError(f"{where}: shard entry {i} has no {key!r} object")
            check_name(info.get("basename"), "shard", f"{where}: shard entry {i} ({key}.basename)")
            size, hashes = info.get("bytes"), info.get("hashes", {})
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < MAX_BYTES:
                raise DatasetError(
                    f"{where}: shard entry {i} has {key}.bytes={str(size)[:40]!r}{FIX}"
                )
            if not isinstance(hashes, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()
            ):
                raise DatasetError(
                    f"{where}: shard entry {i} has {key}.hashes={str(hashes)[:60]!r}{FIX}"
                )
        if shard.get("version") != MDS_INDEX_VERSION:
            raise DatasetError(
                f"{where}: shard entry {i} has version={str(shard.get('version'))[:40]!r}, "
                f"Mosaic Streaming reads version {MDS_INDEX_VERSION}{FIX}"
            )
        samples = shard.get("samples")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
            raise DatasetError(
                f"{where}: shard entry {i} has samples={str(samples)[:40]!r}, not a whole "
                f"number >= 0{FIX}"
            )


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


def not_a_directory(root: Path) -> DatasetError:
    """The error for a dataset path that is not a directory: a file (a shard given for its
    dataset, say: the directory is named) or nothing at all."""
    if root.is_file():
        return DatasetError(
            f"{root}: a file, not a dataset directory; give the directory that holds the "
            f"shards and index ({root.parent})"
        )
    return DatasetError(f"{root}: no such dataset directory")
