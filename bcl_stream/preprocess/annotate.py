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
"""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_stream.cost import CostModel, resolve
from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import (
    MDS_INDEX,
    detect_format,
    mds_shard_entries,
    read_mds_index,
    wds_shards_on_disk,
    write_mds_index,
)
from bcl_stream.formats.mds_lengths import shard_counts
from bcl_stream.formats.npy import load_npy
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.io.hashing import record_digest
from bcl_stream.io.index import INDEX_JSON, CostIndex, ShardEntry, write_index
from bcl_stream.io.remote import is_remote
from bcl_stream.preprocess.lock import holding_output_lock


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


def _mds_counts(root: Path, field: str, as_length: bool, bar: Any) -> list[int]:
    """Counts per record, shard by shard: read from the raw bytes where the encoding allows
    (``mds_lengths``: no streaming import), else decoded with streaming's reader."""
    counts: list[int] = []
    data = read_mds_index(root)
    for shard in data["shards"]:
        raw = shard["raw_data"]["basename"]
        fast = shard_counts(root / raw, shard, field, as_length)
        if fast is not None:
            counts += fast
            bar.update(len(fast))
            continue
        from bcl_stream.io import streaming_compat  # imports streaming: only when needed

        with tempfile.TemporaryDirectory(prefix="bcl_annotate_") as tmp:
            dirname = str(root)
            if not (root / raw).is_file():
                zip_info = shard.get("zip_data") or {}
                zipped = root / str(zip_info.get("basename"))
                if not zip_info or not zipped.is_file():
                    raise DatasetError(f"{root}: shard file {raw} is missing")
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
            for i in range(shard["samples"]):
                sample = reader.get_item(i)
                counts.append(_count(sample[field], f"{raw} sample {i}", as_length))
                bar.update()
    return counts


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


def _wds_counts(
    root: Path, field: str, as_length: bool, bar: Any
) -> tuple[list[int], list[ShardEntry], array[int]]:
    """Token counts, shards and one record hash (xxh64 of its members) per record."""
    counts: list[int] = []
    hashes = array("Q")
    shards: list[ShardEntry] = []
    for name in wds_shards_on_disk(root):
        before = len(counts)
        try:
            for key, member_list in tar_records(root / name):
                members = dict(member_list)
                counts.append(_wds_count(key, members, field, as_length, name))
                hashes.append(record_digest(members.items()))
                bar.update()
        except TAR_ERRORS as exc:
            raise DatasetError(
                f"{root / name}: unreadable tar shard ({exc}); re-download or rewrite the shard"
            ) from exc
        shards.append(ShardEntry(name, len(counts) - before))
    return counts, shards, hashes


@holding_output_lock("annotate", "directory")
def annotate(
    directory: str | os.PathLike[str],
    *,
    tokens_field: str = "input_ids",
    length_field: str | None = None,
    cost_model: str | CostModel = "llama3-8b",
    overwrite: bool = False,
    progress: bool = True,
) -> CostIndex:
    """Write the cost index of a dataset directory or remote URL; output: the index written.

    A remote dataset is downloaded whole to a temporary directory (see ``fetch``) and only the
    cost index and the MDS ``index.json`` pointer are uploaded back. Another live ``annotate`` or
    ``preprocess`` writing the same location is refused at once (``preprocess/lock.py``).
    """
    if is_remote(directory):
        from bcl_stream.preprocess.fetch import fetch_dataset, push_index

        with tempfile.TemporaryDirectory(prefix="bcl_annotate_") as tmp:
            root = fetch_dataset(str(directory), tmp, progress=progress)
            index = _annotate_local(
                root, tokens_field, length_field, cost_model, overwrite, progress
            )
            push_index(root, str(directory))
            return index
    return _annotate_local(
        Path(directory), tokens_field, length_field, cost_model, overwrite, progress
    )


def _annotate_local(
    root: Path,
    tokens_field: str,
    length_field: str | None,
    cost_model: str | CostModel,
    overwrite: bool,
    progress: bool,
) -> CostIndex:
    fmt = detect_format(root)
    model = resolve(cost_model)
    if (root / INDEX_JSON).is_file() and not overwrite:
        raise DatasetError(
            f"{root / INDEX_JSON} already exists; pass --overwrite to replace the cost index"
        )
    field, as_length = (length_field, True) if length_field else (tokens_field, False)
    bar = tqdm(unit="rec", desc="annotate", disable=not progress, mininterval=0.5)
    hashes: array[int] | None = None
    try:
        if fmt == "mds":
            shards = mds_shard_entries(root)
            counts = _mds_counts(root, field, as_length, bar)
        else:
            counts, shards, hashes = _wds_counts(root, field, as_length, bar)
    finally:
        bar.close()
    if not counts:
        raise DatasetError(f"{root}: the dataset holds no records; nothing to annotate")
    source = {"length_field": field} if as_length else {"tokens_field": field}
    index = CostIndex.build(
        counts,
        model,
        shards,
        fmt,
        {"annotate": source},
        None if hashes is None else np.frombuffer(hashes, dtype=np.uint64),
    )
    write_index(root, index)
    if fmt == "mds":
        write_mds_index(root, read_mds_index(root))
    return index
