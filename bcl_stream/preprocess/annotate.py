"""``annotate``: add a cost index to an existing MDS or WebDataset dataset, shards untouched.

Token counts come from the column the readers will read (``preprocess/column_counts.py``): a
token-id column of any name (an integer array, or raw integer bytes with ``tokens_dtype``), a
text column under a tokenizer (``text_field`` + ``tokenizer``), or an integer length column
(``length_field``, checked against the token column on a sample of shards). A column that
holds something else is refused in one line. MDS columns are read from the shard bytes where
the encoding allows, else decoded with streaming's own reader (compressed-only shards are
decompressed to a temporary file first). WebDataset tars are walked member by member in file
order (``tar_scan.tar_records``), which is the order stock ``webdataset`` yields without
shuffling: ``<key>.<field>.npy``, a ``<key>.<field>`` member, or a key of the ``json`` member.

Every record also gets a content hash (``bcl_hashes.npy``, the one the readers check): for
WebDataset over its members, for MDS over its bytes in the shard (stock ``MDSWriter`` records no
shard hash by default, so without these a flipped payload byte would be trained silently). The
shards are not rewritten. A tar with a link member is refused, and record keys that are numbers
but not the records' ids are recorded as names (``preprocess/wds_keys.py``).

The cost index records what was counted (``extra.annotate``: the token source, the tokenizer's
identity for text, the length column) and, apart, how many records checked a length column
(``extra.length_check``).

With no column named, the columns are read as ``preprocess`` reads a record's fields
(``preprocess/source_layout.py``): stored ``input_ids``, else a ``text`` column, a conversation,
or prompt/response columns, so llm-foundry's finetuning MDS needs only ``--tokenizer``.

Trained-token counts (``preprocess/trained_counts.py``) come from a stored ``loss_spans``
column or member, or from prompt/response columns (``response_field``: llm-foundry's
finetuning layout as its converter writes it with stock ``MDSWriter``).

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
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_stream.cost import CostModel, resolve
from bcl_stream.errors import DatasetError
from bcl_stream.io.dataset_dir import (
    MDS_INDEX,
    WDS_SUFFIXES,
    Format,
    detect_format,
    read_mds_index,
    shard_entries,
    wds_shards_on_disk,
    write_mds_index,
)
from bcl_stream.io.index import INDEX_JSON, CostIndex, ShardEntry, write_index
from bcl_stream.io.index_meta import COMPONENTS_FILE
from bcl_stream.io.remote import download, is_remote, join
from bcl_stream.preprocess.annotate_shards import ShardJob, Tally, count_shard, fetcher
from bcl_stream.preprocess.column_counts import (
    LENGTH_CHECK_SHARDS,
    Counting,
    spread,
)
from bcl_stream.preprocess.fetch import push_index
from bcl_stream.preprocess.lock import output_lock
from bcl_stream.preprocess.output import remote_listing
from bcl_stream.preprocess.parts import Part, part_record, shard_span
from bcl_stream.preprocess.shard_pool import map_shards
from bcl_stream.preprocess.source_layout import detected_source, mds_columns, wds_columns
from bcl_stream.preprocess.wds_keys import NAMES, RECORD_KEYS
from bcl_stream.records.image_text import processor_encoder
from bcl_stream.records.source import RecordSource
from bcl_stream.text.tokenizers import tokenizer_identity
from bcl_stream.vision.components import COMPONENTS_KEY, RecordComponents, components_file
from bcl_stream.vision.preprocess import VISION_KEY


def annotate(
    directory: str | os.PathLike[str],
    *,
    source: RecordSource | None = None,
    length_field: str | None = None,
    cost_model: str | CostModel = "llama3-8b",
    overwrite: bool = False,
    progress: bool = True,
    workers: int = 1,
    part: Part | str | None = None,
) -> CostIndex:
    """Write the cost index of a dataset directory or remote URL; output: the index written.

    ``source`` (a :class:`RecordSource`) names the columns counted: the ids of its
    ``tokens_field`` (an integer array, or raw bytes of ``tokens_dtype``), the tokens of its
    ``text_field`` under its ``tokenizer``; or the values of ``length_field`` (then
    checked against the token column on a sample of shards). The index records which
    (``extra.annotate``), and the readers read the same column by default.

    Nothing named (``source`` None, or naming no column: only a ``tokenizer`` or
    ``loss_on``): stored ``input_ids``, else the
    layout ``preprocess`` recognises from the column names (``preprocess/source_layout.py``:
    a ``text`` column, ``messages``/``conversations``, or ``prompt`` + ``response``/
    ``completion``), its text counted under ``tokenizer``.

    Trained tokens (``CostIndex.trained``): from a stored ``loss_spans`` column or member, or,
    with ``response_field``, from prompt/response columns (``tokens_field``/``text_field`` is
    the prompt): the readers then yield ``input_ids`` = prompt + response and ``loss_spans`` =
    the response (``preprocess/trained_counts.py``); or, with ``messages_field`` and a
    ``tokenizer``, from a conversation column rendered with its chat template and masked by
    ``loss_on`` (the readers render it alike). Else every token is trained.

    ``processor`` in ``source`` (``annotate --processor DIR``): image-text records (an
    img2dataset WebDataset's image + caption members, MDS image columns) read whole and
    encoded through that Hugging Face processor exactly as ``preprocess --processor`` encodes
    the same records (``image_counts.py``); the cost components are written beside the index
    (``bcl_components.npz``, sealed in ``extra.components``, the geometry in ``extra.vision``)
    and the readers encode each record alike (``records/image_text.py``).

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
    given = RecordSource() if source is None else source
    chosen = _named_source(given, length_field)
    with (
        output_lock(target, "annotate"),
        tempfile.TemporaryDirectory(prefix="bcl_annotate_") as tmp,
    ):
        remote = is_remote(location)
        root = Path(tmp) / "meta" if remote else Path(location.removeprefix("file://"))
        names = _remote_meta(location, root) if remote else None
        fmt = _remote_format(location, names) if names is not None else detect_format(root)
        _refuse_to_write_over(location, target, root, names, part, overwrite, chosen)
        mds = read_mds_index(root)["shards"] if fmt == "mds" else None
        everything = _shard_names(root, mds, names)
        if chosen is None:
            chosen = _detected(given, location, root, everything, mds, names, Path(tmp))
        counting = Counting(chosen, length_field)
        span = range(len(everything)) if part is None else shard_span(len(everything), part)
        jobs = _shard_jobs(root, everything, mds, names, counting, span)
        fetch, done = fetcher(location, Path(tmp) / "shards") if remote else (None, None)
        tally = _count_shards(jobs, span, everything, mds, workers, fetch, done, progress)
        shards = _index_shards(tally.shards, mds, span, location)
        if not tally.counts and part is None:
            raise DatasetError(f"{location}: the dataset holds no records; nothing to annotate")
        extra = _index_extra(counting, tally, length_field, part, everything)
        components = _components(chosen, tally, extra)
        index = _built_index(tally, resolve(cost_model), shards, fmt, extra, location)
        _write(index, root, location, target, part, Path(tmp) / "out", components)
        return index


def _index_shards(
    counted: list[ShardEntry], mds: list[dict[str, Any]] | None, span: range, location: str
) -> list[ShardEntry]:
    """The index's shard entries: those counted (WebDataset), or the MDS ``index.json``'s own
    entries of the counted span, which the index seals as its pointer to them."""
    if mds is None:
        return counted
    return shard_entries([mds[i] for i in span], join(location, MDS_INDEX))


def _named_source(given: RecordSource, length_field: str | None) -> RecordSource | None:
    """The source checked, when it or ``length_field`` names the columns to count; None when
    nothing is named: the columns are then found by their names (:func:`_detected`), with the
    source's tokenizer and ``loss_on``."""
    if given.response_field is not None and length_field is not None:
        raise ValueError(
            "--response-field and --length-field do not go together: a prompt/response "
            "record's length is counted from its two columns"
        )
    return given.checked() if given.named or length_field is not None else None


def _count_shards(
    jobs: list[ShardJob],
    span: range,
    everything: list[str],
    mds: list[dict[str, Any]] | None,
    workers: int,
    fetch: Any,
    done: Any,
    progress: bool,
) -> Tally:
    """Count every job's shard (``workers`` processes, results in shard order) under a
    progress bar of records (MDS: ``index.json`` counts them) or of shards (WebDataset)."""
    tally = Tally()
    with tqdm(
        total=len(jobs) if mds is None else sum(int(mds[i]["samples"]) for i in span),
        unit="shard" if mds is None else "rec",
        desc="annotate",
        disable=not progress,
        mininterval=0.5,
    ) as bar:
        results = map_shards(count_shard, jobs, workers=workers, fetch=fetch, done=done)
        for i, result in zip(span, results, strict=True):
            added = tally.add(result, everything[i])
            bar.update(1 if mds is None else added)
    return tally


def _built_index(
    tally: Tally,
    model: CostModel,
    shards: list[ShardEntry],
    fmt: Format,
    extra: dict[str, Any],
    location: str,
) -> CostIndex:
    """The cost index of what was counted, once ``model`` is known to cost every record."""
    _check_costs(model, tally.counts, shards, location)
    return CostIndex.build(
        tally.counts,
        model,
        shards,
        fmt,
        extra,
        np.frombuffer(tally.hashes, dtype=np.uint64),
        np.frombuffer(tally.trained, dtype=np.uint32) if tally.masked else None,
    )


def _refuse_to_write_over(
    location: str,
    target: str,
    root: Path,
    names: set[str] | None,
    part: Part | None,
    overwrite: bool,
    chosen: RecordSource | None,
) -> None:
    """Refuse before any shard is read: an existing cost index without ``overwrite``, or an
    image-text dataset annotated without ``--processor`` (its images' cost components would
    be dropped)."""
    if _has_index(target, names, part) and not overwrite:
        raise DatasetError(
            f"{join(target, INDEX_JSON)} already exists; pass --overwrite to replace the cost index"
        )
    if (root / COMPONENTS_FILE).is_file() and (chosen is None or chosen.processor is None):
        raise DatasetError(
            f"{location}: an image-text dataset ({COMPONENTS_FILE} holds its images' cost "
            "components); a new index without them would drop the images' cost: pass "
            "--processor DIR (the model's processor) to count them"
        )


def _shard_names(root: Path, mds: list[dict[str, Any]] | None, names: set[str] | None) -> list[str]:
    """Every shard of the dataset in reading order: MDS as ``index.json`` lists them, else the
    tars at the top of the listing (remote) or of the directory (local)."""
    if mds is not None:
        return [s["raw_data"]["basename"] for s in mds]
    if names is not None:
        return sorted(n for n in names if n.endswith(WDS_SUFFIXES) and "/" not in n)
    return wds_shards_on_disk(root)


def _detected(
    given: RecordSource,
    location: str,
    root: Path,
    everything: list[str],
    mds: list[dict[str, Any]] | None,
    names: set[str] | None,
    tmp: Path,
) -> RecordSource:
    """Nothing named: the record kind ``preprocess`` would see in the first shard's columns
    (``source_layout.py``), under the given tokenizer, ``loss_on`` and chat template (a
    template given for a kind that is not a conversation is refused). No shard at all: the
    default source, and the dataset is refused later as holding no records."""
    if not everything:
        return RecordSource()
    columns = (
        mds_columns(mds[0])
        if mds
        else wds_columns(_first_tar(location, root, everything, names, tmp))
    )
    found = detected_source(columns, given.tokenizer, given.loss_on, location)
    if given.chat_template is None and given.chat_template_kwargs is None:
        return found
    if found.messages_field is None:
        raise DatasetError(
            f"{location}: --chat-template and --chat-template-kwargs render a conversation "
            "column, and this dataset's columns make no conversation; drop them"
        )
    return replace(
        found,
        chat_template=given.chat_template,
        chat_template_kwargs=given.chat_template_kwargs,
    )


def _shard_jobs(
    root: Path,
    everything: list[str],
    mds: list[dict[str, Any]] | None,
    names: set[str] | None,
    counting: Counting,
    span: range,
) -> list[ShardJob]:
    """One job per shard of ``span``; a length column is checked on a spread sample of them."""
    checked_shards = set(spread(list(span), LENGTH_CHECK_SHARDS))
    return [
        ShardJob(
            str(root),
            _stored_name(everything[i], mds, i, names),
            None if mds is None else mds[i],
            counting,
            i in checked_shards,
        )
        for i in span
    ]


def _index_extra(
    counting: Counting,
    tally: Tally,
    length_field: str | None,
    part: Part | None,
    everything: list[str],
) -> dict[str, Any]:
    """The index's ``extra``: what was counted (``annotate``, shared by the parts of a merge),
    record keys kept as names, the length check, and a part's place in the shard list."""
    record = counting.record()
    if counting.source.tokenizer is not None:
        record["tokenizer_id"] = tokenizer_identity(counting.source.tokenizer)
    extra: dict[str, Any] = {"annotate": record}
    if tally.key_names and part is None:
        extra[RECORD_KEYS] = NAMES
    if length_field is not None:  # apart from "annotate", which the parts of a merge share
        extra["length_check"] = {"records": tally.checked}
    if part is not None:
        extra["part"] = part_record(part, "annotate", _shard_identity(everything))
    return extra


def _check_costs(
    model: CostModel, counts: list[int], shards: list[ShardEntry], location: str
) -> None:
    """Refuse a cost model that cannot cost some record (a cost past what the index stores),
    naming the shard and record: written, it would fail every later plan with no file named."""
    first = model.first_overflow(counts)
    if first is None:
        return
    start = 0
    for shard in shards:
        if first < start + shard.samples:
            break
        start += shard.samples
    raise DatasetError(
        f"{location}: shard {shard.name}, record {first - start} (record {first} of the "
        f"dataset): {model.overflow_message(counts[first])}"
    )


def _first_tar(
    location: str, root: Path, everything: list[str], names: set[str] | None, tmp: Path
) -> Path:
    """The first WebDataset tar, local (remote: downloaded into ``tmp``, one shard more than
    the count downloads), whose first record's members name the columns."""
    if names is None:
        return root / everything[0]
    local = tmp / "first" / everything[0]
    download(join(location, everything[0]), local)
    return local


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


def _components(chosen: RecordSource | None, tally: Tally, extra: dict[str, Any]) -> bytes | None:
    """Image-text records (``--processor``): the ``bcl_components.npz`` bytes, their entry and
    the processor's geometry put in ``extra`` (before the index is built); None for text."""
    if chosen is None or chosen.processor is None:
        return None
    data, extra[COMPONENTS_KEY] = components_file(RecordComponents.build(tally.components))
    extra[VISION_KEY] = processor_encoder(chosen.processor, chosen.loss_on).provenance()
    return data


def _write(
    index: CostIndex,
    root: Path,
    location: str,
    target: str,
    part: Part | None,
    out: Path,
    components: bytes | None,
) -> None:
    """The cost index (image-text: its components file first; then, for a whole MDS dataset,
    ``index.json`` with the pointer) at ``target``: written in place (local) or staged in
    ``out`` and uploaded (remote)."""
    remote = is_remote(location)
    local = out if remote else Path(target.removeprefix("file://"))
    if components is not None:
        local.mkdir(parents=True, exist_ok=True)
        (local / COMPONENTS_FILE).write_bytes(components)
    write_index(local, index)
    if part is None and index.format == "mds":
        write_mds_index(local, read_mds_index(root))
    if remote:
        push_index(local, target)
