"""``annotate``: add a cost index to an existing MDS or WebDataset dataset, shards untouched.

Token counts come from a token-id column/member (``tokens_field``: the count is its length)
or from an integer length column (``length_field``). MDS samples are decoded with streaming's
own reader (so every encoding it supports works); compressed-only shards are decompressed to
a temporary file first (both through :mod:`bcl_stream.io.streaming_compat`). WebDataset tars
are walked member by member in file order (``tar_scan.tar_records``), which is the order stock
``webdataset`` yields without shuffling: ``<key>.<tokens_field>.npy`` gives
ids, ``length_field`` is read from the ``json`` member or from a ``<key>.<length_field>``
text member.

WebDataset records also get a content hash each (``bcl_hashes.npy``, the one the reader checks).

Only ``bcl_costs.npy`` (+ ``bcl_hashes.npy``), ``bcl_index.json`` and (MDS) the pointer key in
``index.json`` are written, in that order.

Large datasets: shards are counted one job per shard through ``shard_pool`` (``--workers``
processes decode; a remote dataset's shards are downloaded by threads a few at a time, never
the whole dataset at once), results in shard order, so the index is byte-identical to a serial
run. ``--part I/N`` counts a contiguous run of shards into ``DIR/part-I-of-N`` for
``bcl-stream merge`` (``preprocess/parts.py``), so many machines can share one dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_stream.cost import CostModel, resolve
from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import (
    MDS_INDEX,
    WDS_SUFFIXES,
    Format,
    detect_format,
    read_mds_index,
    shard_entries,
    wds_shards_on_disk,
    write_mds_index,
)
from bcl_stream.formats.mds_lengths import shard_counts
from bcl_stream.formats.npy import load_npy
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.io.hashing import record_digest
from bcl_stream.io.index import INDEX_JSON, CostIndex, ShardEntry, write_index
from bcl_stream.io.remote import download, is_remote, join
from bcl_stream.preprocess.lock import output_lock
from bcl_stream.preprocess.output import remote_listing
from bcl_stream.preprocess.parts import Part, part_record, shard_span
from bcl_stream.preprocess.shard_pool import map_shards


def _count(value: Any, where: str, as_length: bool) -> int:
    if as_length:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace").strip()
        try:
            n = int(value) if not isinstance(value, np.ndarray) else int(value.reshape(-1)[0])
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: length {value!r} is not an integer") from exc
    else:
        if not hasattr(value, "__len__"):
            raise DatasetError(f"{where}: token field is a {type(value).__name__}, not a sequence")
        n = len(value)
    if n < 0:
        raise DatasetError(f"{where}: negative length {n}")
    return n


def _mds_shard(root: Path, shard: dict[str, Any], field: str, as_length: bool) -> list[int]:
    """Counts per record of one MDS shard: read from the raw bytes where the encoding allows
    (``mds_lengths``: no streaming import), else decoded with streaming's reader."""
    raw = shard["raw_data"]["basename"]
    fast = shard_counts(root / raw, shard, field, as_length)
    if fast is not None:
        return fast
    from bcl_stream.io import streaming_compat  # imports streaming: only when needed

    with tempfile.TemporaryDirectory(prefix="bcl_annotate_") as tmp:
        dirname = str(root)
        if not (root / raw).is_file():
            zip_info = shard.get("zip_data") or {}
            zipped = root / str(zip_info.get("basename"))
            if not zip_info or not zipped.is_file():
                raise DatasetError(f"{root}: shard file {raw} is missing")
            Path(tmp, raw).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, raw).write_bytes(
                streaming_compat.decompress(shard["compression"], zipped.read_bytes())
            )
            dirname = tmp
        reader = streaming_compat.mds_shard_reader(dirname, shard)
        columns = shard.get("column_names", [])
        if field not in columns:
            raise DatasetError(
                f"{root / MDS_INDEX}: no column {field!r} (columns: {columns}); pass "
                "--tokens-field or --length-field with one of them"
            )
        return [
            _count(reader.get_item(i)[field], f"{raw} sample {i}", as_length)
            for i in range(shard["samples"])
        ]


def _wds_count(key: str, members: dict[str, bytes], field: str, as_length: bool, where: str) -> int:
    if not as_length:
        blob = members.get(f"{field}.npy")
        if blob is None:
            raise DatasetError(
                f"{where} sample {key}: no member {field}.npy (members: {sorted(members)}); "
                "pass --tokens-field NAME or --length-field NAME"
            )
        return int(load_npy(blob).size)
    if field in members:
        return _count(members[field], f"{where} sample {key}", True)
    if "json" in members:
        meta = json.loads(members["json"])
        if isinstance(meta, dict) and field in meta:
            return _count(meta[field], f"{where} sample {key}", True)
    raise DatasetError(
        f"{where} sample {key}: no {field!r} in its json member nor a .{field} member "
        f"(members: {sorted(members)})"
    )


def _wds_shard(root: Path, name: str, field: str, as_length: bool) -> tuple[list[int], array[int]]:
    """Token counts and one record hash (xxh64 of its members) per record of one tar."""
    counts: list[int] = []
    hashes = array("Q")
    try:
        for key, member_list in tar_records(root / name):
            members = dict(member_list)
            counts.append(_wds_count(key, members, field, as_length, name))
            hashes.append(record_digest(members.items()))
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{root / name}: unreadable tar shard ({exc}); re-download or rewrite the shard"
        ) from exc
    return counts, hashes


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to count (picklable: it crosses to a worker process)."""

    root: str
    """Where the shard is: the dataset (local), or the local copy once fetched."""
    name: str
    """The file to read (an MDS shard's raw or compressed file, a tar)."""
    mds: dict[str, Any] | None
    """The MDS ``index.json`` entry (None: a WebDataset tar)."""
    field: str
    as_length: bool


def count_shard(job: ShardJob) -> tuple[list[int], array[int] | None]:
    """The work of one shard: its counts (and record hashes, WebDataset)."""
    root = Path(job.root)
    if job.mds is not None:
        return _mds_shard(root, job.mds, job.field, job.as_length), None
    return _wds_shard(root, job.name, job.field, job.as_length)


def _fetcher(location: str, tmp: Path) -> tuple[Any, Any]:
    """(fetch, done) for :func:`map_shards`: download a remote shard, delete it after use."""

    def fetch(job: ShardJob) -> ShardJob:
        download(join(location, job.name), tmp / job.name)
        return replace(job, root=str(tmp))

    def done(job: ShardJob) -> None:
        (tmp / job.name).unlink(missing_ok=True)

    return fetch, done


def annotate(
    directory: str | os.PathLike[str],
    *,
    tokens_field: str = "input_ids",
    length_field: str | None = None,
    cost_model: str | CostModel = "llama3-8b",
    overwrite: bool = False,
    progress: bool = True,
    workers: int = 1,
    part: Part | str | None = None,
) -> CostIndex:
    """Write the cost index of a dataset directory or remote URL; output: the index written.

    ``workers`` processes decode shards (``shard_pool``); a remote dataset's shards are
    downloaded by threads a few at a time and deleted once counted, and only the cost index and
    the MDS ``index.json`` pointer are uploaded back. The index is byte-identical for any
    ``workers``. ``part`` (``"I/N"``): count only the I-th of N contiguous runs of shards and
    write their cost index to ``directory/part-I-of-N`` (join with ``bcl-stream merge``).
    Another live ``annotate`` or ``preprocess`` writing the same location is refused at once
    (``preprocess/lock.py``).
    """
    location = str(directory)
    if isinstance(part, str):
        part = Part.parse(part)
    target = location if part is None else part.location(location)
    field, as_length = (length_field, True) if length_field else (tokens_field, False)
    with (
        output_lock(target, "annotate"),
        tempfile.TemporaryDirectory(prefix="bcl_annotate_") as tmp,
    ):
        remote = is_remote(location)
        root = Path(tmp) / "meta" if remote else Path(location.removeprefix("file://"))
        names = _remote_meta(location, root) if remote else None
        fmt = _remote_format(location, names) if names is not None else detect_format(root)
        if _has_index(target, names, part) and not overwrite:
            raise DatasetError(
                f"{join(target, INDEX_JSON)} already exists; pass --overwrite to replace the "
                "cost index"
            )
        mds = read_mds_index(root)["shards"] if fmt == "mds" else None
        everything = (
            [s["raw_data"]["basename"] for s in mds]
            if mds is not None
            else sorted(n for n in names if n.endswith(WDS_SUFFIXES) and "/" not in n)
            if names is not None
            else wds_shards_on_disk(root)
        )
        span = range(len(everything)) if part is None else shard_span(len(everything), part)
        jobs = [
            ShardJob(
                str(root),
                _stored_name(everything[i], mds, i, names),
                None if mds is None else mds[i],
                field,
                as_length,
            )
            for i in span
        ]
        fetch, done = _fetcher(location, Path(tmp) / "shards") if remote else (None, None)
        counts: list[int] = []
        hashes = array("Q")
        shards: list[ShardEntry] = []
        with tqdm(unit="rec", desc="annotate", disable=not progress, mininterval=0.5) as bar:
            results = map_shards(count_shard, jobs, workers=workers, fetch=fetch, done=done)
            for i, (shard_counts_, shard_hashes) in zip(span, results, strict=True):
                counts += shard_counts_
                if shard_hashes is not None:
                    hashes += shard_hashes
                shards.append(ShardEntry(everything[i], len(shard_counts_)))
                bar.update(len(shard_counts_))
        if mds is not None:
            shards = shard_entries([mds[i] for i in span], join(location, MDS_INDEX))
        if not counts and part is None:
            raise DatasetError(f"{location}: the dataset holds no records; nothing to annotate")
        extra: dict[str, Any] = {
            "annotate": {"length_field": field} if as_length else {"tokens_field": field}
        }
        if part is not None:
            extra["part"] = part_record(part, "annotate", _shard_identity(everything))
        index = CostIndex.build(
            counts,
            resolve(cost_model),
            shards,
            fmt,
            extra,
            None if fmt == "mds" else np.frombuffer(hashes, dtype=np.uint64),
        )
        _write(index, root, location, target, part, Path(tmp) / "out")
        return index


def _stored_name(raw: str, mds: list[dict[str, Any]] | None, i: int, names: set[str] | None) -> str:
    """The file a shard job reads: the raw MDS shard, or its compressed file when only that is
    stored (remote: as listed; local: ``_mds_shard`` falls back by itself)."""
    if mds is None or names is None or raw in names:
        return raw
    return str((mds[i].get("zip_data") or {}).get("basename") or raw)


def _remote_meta(location: str, meta: Path) -> set[str]:
    """List a remote dataset and download its MDS ``index.json`` (if any) into ``meta``."""
    names = set(remote_listing(location))
    if not names:
        raise DatasetError(f"{location}: no such dataset (nothing stored under it)")
    meta.mkdir(parents=True, exist_ok=True)
    if MDS_INDEX in names:
        download(join(location, MDS_INDEX), meta / MDS_INDEX)
    return names


def _remote_format(location: str, names: set[str]) -> Format:
    if MDS_INDEX in names or any(".mds" in n for n in names):
        return "mds"
    if any(n.endswith(WDS_SUFFIXES) and "/" not in n for n in names):
        return "wds"
    raise DatasetError(f"{location}: not a dataset (no index.json, no .mds or .tar shards)")


def _has_index(target: str, names: set[str] | None, part: Part | None) -> bool:
    if names is not None:
        return (INDEX_JSON if part is None else f"{part.name}/{INDEX_JSON}") in names
    return Path(target.removeprefix("file://"), INDEX_JSON).is_file()


def _shard_identity(names: list[str]) -> dict[str, Any]:
    """What annotate parts record about the shard list they were cut from."""
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return {"shards": len(names), "names_sha256": digest}


def _write(
    index: CostIndex, root: Path, location: str, target: str, part: Part | None, out: Path
) -> None:
    """The cost index (then, for a whole MDS dataset, ``index.json`` with the pointer) at
    ``target``: written in place (local) or staged in ``out`` and uploaded (remote)."""
    from bcl_stream.preprocess.fetch import push_index

    remote = is_remote(location)
    local = out if remote else Path(target.removeprefix("file://"))
    write_index(local, index)
    if part is None and index.format == "mds":
        write_mds_index(local, read_mds_index(root))
    if remote:
        push_index(local, target)
