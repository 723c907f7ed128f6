"""``merge``: join the parts of a partitioned run into one costed dataset, in part order.

Parts are complete sub-datasets under ``OUTPUT/part-I-of-N/`` (``preprocess --part``) or cost
indexes of contiguous shard runs of an existing dataset (``annotate --part``). The merge
writes, at ``OUTPUT``:

- MDS: ``index.json`` listing every shard of every part in part order, each basename prefixed
  by its part directory (what Mosaic Streaming's ``merge_index`` writes, so stock
  ``StreamingDataset`` reads the merged root), with our pointer key;
- one cost index (``bcl_costs.npy``, ``bcl_hashes.npy`` for WebDataset, ``bcl_index.json``)
  whose records, hashes and shard table follow the order a reader sees: part 0's records,
  then part 1's, ... For WebDataset ``bcl_index.json`` is the shard list.

No shard is copied or rewritten: merging reads only the parts' index files (kilobytes, plus
12 B/record of costs), so it takes seconds for any corpus and is safe to re-run. The old
completion marker is removed first and written last, so a reader never sees a merged index
over a different cost index. Refused, naming the part and what to do: a part missing, one
incomplete (killed mid-write), one whose recorded identity differs from its directory name (a
copy of another part), parts of two different splits (``of-3`` beside ``of-4``), and parts
that differ in format, tokenizer, chat template, template variables
(``--chat-template-kwargs``), loss mask (``--loss-on``), cost model, inputs, token source or
processor geometry. Image-text parts (``--processor``) have their cost components
(``bcl_components.npz``) concatenated in part order, written before the index that seals them.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.errors import BCLStreamError, DatasetError
from bcl_stream.io.dataset_dir import (
    MDS_INDEX,
    MDS_INDEX_VERSION,
    WDS_SUFFIXES,
    read_mds_index,
    shard_entries,
    write_mds_index,
)
from bcl_stream.io.index import (
    INDEX_FILES,
    INDEX_JSON,
    CostIndex,
    ShardEntry,
    current_records,
    read_index,
    write_index,
)
from bcl_stream.io.index_meta import COMPONENTS_FILE
from bcl_stream.io.remote import download, is_remote, join, list_remote
from bcl_stream.preprocess.fetch import push_index
from bcl_stream.preprocess.lock import output_lock
from bcl_stream.preprocess.output import delete_remote, is_complete
from bcl_stream.preprocess.parts import Part
from bcl_stream.vision.components import (
    COMPONENTS_KEY,
    RecordComponents,
    components_file,
    read_components,
)
from bcl_stream.vision.preprocess import VISION_KEY

SAME = (
    "format",
    "tokenizer",
    "chat_template",
    "chat_template_kwargs",
    "loss_on",
    "kind",
    "inputs",
    "annotate",
    "vision",
)
"""What every part must share with part 0 (besides the cost model and record hashes); ``vision``
is the processor's geometry of image-text parts (``preprocess --processor``), None for text."""


@dataclass(frozen=True, slots=True)
class _Part:
    """One part as found: where its index files are (local), which files it holds."""

    part: Part
    location: str
    root: Path
    names: frozenset[str]


def _refuse(where: str, what: str) -> DatasetError:
    return DatasetError(f"cannot merge {where}: {what}")


def select_parts(output: str, dirnames: Iterable[str]) -> list[Part]:
    """Parts 0..N-1 of one split among ``dirnames``, or a DatasetError naming what is wrong."""
    found = sorted(
        {p for p in map(Part.from_name, dirnames) if p is not None},
        key=lambda p: (p.count, p.index),
    )
    if not found:
        raise _refuse(
            output,
            "no part directories (part-I-of-N) found. Write them with `bcl-stream preprocess "
            "... --part I/N` (or `annotate --part I/N`) first.",
        )
    splits = Counter(p.count for p in found)
    if len(splits) > 1:
        shown = ", ".join(f"{n} x part-*-of-{count}" for count, n in sorted(splits.items()))
        raise _refuse(
            output,
            f"parts of different splits are present ({shown}): one split is stale or a part "
            "is duplicated under another N. Remove the directories of the split you do not "
            "want, then merge again.",
        )
    count = found[0].count
    missing = sorted(set(range(count)) - {p.index for p in found})
    if missing:
        names = ", ".join(Part(i, count).name for i in missing[:5])
        raise _refuse(
            output,
            f"{len(missing)} of {count} parts missing ({names}): run each missing part "
            f"(`--part {missing[0]}/{count}` ...), then merge again.",
        )
    return found


def _part_record(item: _Part, index: CostIndex) -> dict[str, Any]:
    record = index.extra.get("part")
    if not isinstance(record, dict) or "index" not in record:
        raise _refuse(
            item.location,
            "its cost index was not written as a part (no 'part' entry); write it with "
            f"`--part {item.part}`",
        )
    if (record.get("index"), record.get("count")) != (item.part.index, item.part.count):
        raise _refuse(
            item.location,
            f"it holds part {record.get('index')}/{record.get('count')}, not "
            f"{item.part}: a duplicated or misplaced part (copied from another part?). Re-run "
            f"`--part {item.part}` into it, then merge again.",
        )
    return record


def _identity(index: CostIndex, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": index.format,
        "tokenizer": index.extra.get("tokenizer"),
        "chat_template": index.extra.get("chat_template"),
        "loss_on": (index.extra.get("preprocess") or {}).get("loss_on"),
        "chat_template_kwargs": (index.extra.get("preprocess") or {}).get("chat_template_kwargs"),
        "kind": record.get("kind"),
        "inputs": record.get("inputs"),
        "annotate": index.extra.get("annotate"),
        "vision": index.extra.get(VISION_KEY),
    }


def _check_alike(item: _Part, index: CostIndex, first: CostIndex, same: dict[str, Any]) -> None:
    mine = _identity(index, index.extra["part"])
    for key in SAME:
        if mine[key] != same[key]:
            raise _refuse(
                item.location,
                f"its {key} is {mine[key]!r}, part 0's is {same[key]!r}: parts of one dataset "
                f"must be written alike. Re-run `--part {item.part}` with part 0's options.",
            )
    if index.cost_model != first.cost_model:
        raise _refuse(
            item.location,
            f"its cost model is {index.cost_model.name!r}, part 0's is "
            f"{first.cost_model.name!r}. Re-run `--part {item.part}` with part 0's --cost-model.",
        )
    if (index.record_hashes is None) != (first.record_hashes is None):
        raise _refuse(item.location, "it has record hashes and part 0 has none (or the reverse)")


def _mds_entries(item: _Part, index: CostIndex) -> list[dict[str, Any]]:
    """The part's MDS shard entries (basenames prefixed by the part directory), checked
    against its cost index and the files it holds."""
    shards = read_mds_index(item.root)["shards"]
    if shard_entries(shards, item.location) != list(index.shards):
        raise _refuse(
            item.location,
            f"its {MDS_INDEX} and {INDEX_JSON} list different shards; re-run `--part {item.part}`",
        )
    out = []
    for shard in shards:
        entry = copy.deepcopy(shard)
        names = [entry[k]["basename"] for k in ("raw_data", "zip_data") if entry.get(k)]
        if not any(n in item.names for n in names):
            raise _refuse(
                item.location, f"shard {names[0]} is missing; re-run `--part {item.part}`"
            )
        for k in ("raw_data", "zip_data"):
            if entry.get(k):
                entry[k]["basename"] = f"{item.part.name}/{entry[k]['basename']}"
        out.append(entry)
    return out


def _sum_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' preprocessing reports added up (seconds: summed over parts)."""
    total: dict[str, Any] = copy.deepcopy(reports[0])
    for report in reports[1:]:
        for key, value in report.items():
            if key in ("records_read", "records_written", "tokens_written", "bytes_read") or (
                key in ("blank_lines", "shards", "trained_tokens_written", "masked_records")
                or key.startswith("seconds")
            ):
                total[key] += value
            elif key == "skipped_first":
                total[key] = (total[key] + value)[:5]
            elif key == "skipped_file" and value:
                total[key] = total[key] or value  # each part lists its own
            elif key == "skipped_bad":
                total[key] = dict(Counter(total[key]) + Counter(value))
            elif key == "empty_inputs":
                total[key] = total[key] + value
            elif key == "outliers" and value:
                for k in ("truncated", "dropped", "tokens_removed", "dropped_untrained"):
                    total[key][k] = total[key].get(k, 0) + value.get(k, 0)
                total[key]["longest_seen"] = max(total[key]["longest_seen"], value["longest_seen"])
    if isinstance(total.get("output"), str):  # a part's directory -> the merged root (or URL)
        total["output"] = total["output"].rstrip("/").rsplit("/", 1)[0]
    return total


def merge_indexes(
    parts: list[_Part], top_names: set[str], output: str
) -> tuple[CostIndex, Any, bytes | None]:
    """The merged cost index, (MDS) the merged ``index.json`` data (None for WDS) and (image-text
    parts) the merged ``bcl_components.npz`` bytes its ``extra`` seals (None for text)."""
    indexes: list[CostIndex] = []
    for item in parts:
        if not is_complete(item.names):
            raise _refuse(
                item.location,
                f"the part is incomplete (no completion marker: killed or still running). "
                f"Re-run `--part {item.part}`, then merge again.",
            )
        try:
            index = read_index(item.root)
        except BCLStreamError as exc:
            raise _refuse(item.location, f"{exc}") from exc
        record = _part_record(item, index)
        if indexes:
            _check_alike(item, index, indexes[0], _identity(indexes[0], indexes[0].extra["part"]))
        elif record.get("kind") not in ("preprocess", "annotate"):
            raise _refuse(item.location, f"unknown part kind {record.get('kind')!r}")
        indexes.append(index)
    first = indexes[0]
    kind = first.extra["part"]["kind"]
    own = sorted(n for n in top_names if ".mds" in n or n.endswith(WDS_SUFFIXES))
    if kind == "preprocess" and own:
        raise _refuse(
            output, f"it holds shards of its own ({', '.join(own[:3])}); merge into an empty root"
        )
    shards: list[ShardEntry] = []
    mds: list[dict[str, Any]] = []
    for item, index in zip(parts, indexes, strict=True):
        if first.format == "mds" and kind == "preprocess":
            mds += _mds_entries(item, index)
        for shard in index.shards:
            name = f"{item.part.name}/{shard.name}" if kind == "preprocess" else shard.name
            if kind == "preprocess" and first.format == "wds" and shard.name not in item.names:
                raise _refuse(
                    item.location, f"shard {shard.name} is missing; re-run `--part {item.part}`"
                )
            shards.append(ShardEntry(name, shard.samples))
    records = np.concatenate([current_records(ix) for ix in indexes])
    records.flags.writeable = False
    hashes = (
        None
        if first.record_hashes is None
        else np.concatenate([ix.record_hashes for ix in indexes if ix.record_hashes is not None])
    )
    firsts = np.cumsum([0] + [len(ix) for ix in indexes]).tolist()
    extra: dict[str, Any] = {
        k: first.extra[k] for k in ("tokenizer", "chat_template", "annotate") if k in first.extra
    }
    reports = [ix.extra["preprocess"] for ix in indexes if "preprocess" in ix.extra]
    if len(reports) == len(indexes):
        extra["preprocess"] = _sum_reports(reports)
    components = _merged_components(parts, indexes)
    if components is not None:
        extra[VISION_KEY] = first.extra[VISION_KEY]
        extra[COMPONENTS_KEY] = components[1]
    extra["merge"] = {
        "kind": kind,
        "parts": [
            {
                "name": item.part.name,
                "first": firsts[i],
                "records": len(ix),
                "sha256": ix.content_hash(),
            }
            for i, (item, ix) in enumerate(zip(parts, indexes, strict=True))
        ],
    }
    merged = CostIndex(records, first.cost_model, tuple(shards), first.format, extra, hashes)
    if not len(merged):
        raise _refuse(output, "the parts hold no records at all; check the inputs")
    data = None
    if first.format == "mds":
        data = {"version": MDS_INDEX_VERSION, "shards": mds}
    return merged, data, None if components is None else components[0]


def _merged_components(
    parts: list[_Part], indexes: list[CostIndex]
) -> tuple[bytes, dict[str, Any]] | None:
    """Image-text parts: their cost components concatenated in part order (each checked
    against its part's token counts), as the file's bytes and its index entry; None for text
    parts (``_check_alike`` has made every part alike in this)."""
    if VISION_KEY not in indexes[0].extra:
        return None
    found: list[RecordComponents] = []
    for item, index in zip(parts, indexes, strict=True):
        try:
            components = read_components(item.root, index.tokens)
        except BCLStreamError as exc:
            raise _refuse(item.location, f"{exc}; re-run `--part {item.part}`") from exc
        if components is None:
            raise _refuse(
                item.location,
                f"its index names no image-text components ({COMPONENTS_FILE}); re-run "
                f"`--part {item.part}`",
            )
        found.append(components)
    return components_file(RecordComponents.concatenate(found))


def _check_annotated(output: str, root: Path, index: CostIndex, names: set[str]) -> Any:
    """Annotate parts: the concatenated shard list must be the dataset's own, in order."""
    if index.format == "mds":
        data = read_mds_index(root)
        own = shard_entries(data["shards"], join(output, MDS_INDEX))
    else:
        data = None
        own = [ShardEntry(n, -1) for n in sorted(n for n in names if n.endswith(WDS_SUFFIXES))]
    if [s.name for s in own] != [s.name for s in index.shards] or (
        data is not None and own != list(index.shards)
    ):
        raise _refuse(
            output,
            f"the annotated parts cover {len(index.shards)} shards, the dataset lists "
            f"{len(own)} (changed since the parts were annotated?). Re-run every "
            "`annotate --part`, then merge again.",
        )
    return data


def _local_parts(root: Path) -> tuple[list[_Part], set[str]]:
    if not root.is_dir():
        raise _refuse(str(root), "no such directory")
    top = {p.name for p in root.iterdir()}
    parts = select_parts(str(root), (n for n in top if (root / n).is_dir()))
    found = []
    for part in parts:
        base = root / part.name
        names = frozenset(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
        found.append(_Part(part, str(base), base, names))
    return found, top


def _remote_parts(output: str, tmp: Path) -> tuple[list[_Part], set[str]]:
    listing = list_remote(output)
    top = {n for n in listing if "/" not in n}
    parts = select_parts(output, {n.split("/", 1)[0] for n in listing if "/" in n})
    found = []
    for part in parts:
        prefix = part.name + "/"
        names = frozenset(n[len(prefix) :] for n in listing if n.startswith(prefix))
        base = tmp / part.name
        for name in (*INDEX_FILES, MDS_INDEX):
            if name in names:
                download(join(output, prefix + name), base / name)
        base.mkdir(parents=True, exist_ok=True)
        found.append(_Part(part, join(output, part.name), base, names))
    if MDS_INDEX in top:
        download(join(output, MDS_INDEX), tmp / MDS_INDEX)
    return found, top


def _marker(index: CostIndex) -> str | None:
    """The completion marker a merge removes before writing: ours only (an annotated MDS
    dataset's ``index.json`` is its own, replaced in one rename at the end)."""
    if index.format == "wds":
        return INDEX_JSON
    return MDS_INDEX if index.extra["merge"]["kind"] == "preprocess" else None


def _write_local(root: Path, index: CostIndex, data: Any, components: bytes | None) -> None:
    """Completion marker out first, cost index (its components file before the JSON that seals
    it), marker back last (see the module docstring)."""
    marker = _marker(index)
    if marker:
        (root / marker).unlink(missing_ok=True)
    if components is not None:
        root.mkdir(parents=True, exist_ok=True)
        (root / COMPONENTS_FILE).write_bytes(components)
    write_index(root, index)
    if data is not None:
        write_mds_index(root, data)


def merge(output: str | os.PathLike[str]) -> CostIndex:
    """Merge the parts under ``output`` (a directory or ``s3://`` URL) into one dataset there;
    output: the merged cost index. Holds ``output``'s write lock while it works."""
    location = str(output)
    with output_lock(location, "merge"):
        if not is_remote(location):
            root = Path(location.removeprefix("file://"))
            parts, top = _local_parts(root)
            index, data, components = merge_indexes(parts, top, location)
            if index.extra["merge"]["kind"] == "annotate":
                data = _check_annotated(location, root, index, top)
            _write_local(root, index, data, components)
            return index
        tmp = Path(tempfile.mkdtemp(prefix="bcl_merge_"))
        try:
            parts, top = _remote_parts(location, tmp)
            index, data, components = merge_indexes(parts, top, location)
            if index.extra["merge"]["kind"] == "annotate":
                data = _check_annotated(location, tmp, index, top)
            delete_remote(location, [n for n in (_marker(index),) if n in top])
            out = tmp / "merged"
            _write_local(out, index, data, components)
            push_index(out, location)
            return index
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
