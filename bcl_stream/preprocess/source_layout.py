"""Which columns ``annotate`` counts when none is named: the layout ``preprocess`` would see.

Why: ``preprocess`` recognises a record's layout from its field names
(:func:`bcl_stream.records.registry.detect`: a ``text`` field, else ``messages`` /
``conversations``, else ``prompt`` + ``response``/``completion``). An existing dataset in one of
those layouts (llm-foundry's finetuning MDS as its converter writes it with stock
``MDSWriter``: ``prompt`` + ``response`` text columns) should not need its columns named to be
annotated. The dataset's column names (MDS: the first shard's ``index.json`` entry;
WebDataset: the first record's members and the keys of its ``json`` member) go through the
same function, so the two commands recognise the same layouts.

Stored token ids (``input_ids``, what bcl-stream writes) come first: they are what the readers
read, and counting them needs no tokenizer. A text or conversation layout needs a tokenizer;
without one it is refused naming the layout found and the option to add.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.formats.token_ids import TEXT_MEMBERS
from bcl_stream.records.kind import IDS, OTHER, TEXT
from bcl_stream.records.registry import declared_source
from bcl_stream.records.source import DEFAULT_FIELD, RecordSource


def mds_columns(shard: dict[str, Any]) -> dict[str, str]:
    """Column name -> ids / text / other, from an MDS shard's ``index.json`` entry."""
    out = {}
    for name, encoding in zip(shard["column_names"], shard["column_encodings"], strict=True):
        kind = str(encoding).split(":")[0]
        out[name] = IDS if kind == "ndarray" else TEXT if kind == "str" else OTHER
    return out


def wds_columns(tar: Path) -> dict[str, str]:
    """Column name -> ids / text / other, from the first record of a WebDataset tar:
    ``<field>.npy`` members are ids, text members and json strings are text, json lists of
    integers are ids."""
    try:
        first = next(tar_records(tar), None)
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{tar}: unreadable tar shard ({exc}); re-download or rewrite it"
        ) from exc
    if first is None:
        return {}
    out: dict[str, str] = {}
    for ext, payload in first[1]:
        if ext == "json":
            try:
                meta = json.loads(payload)
            except ValueError:
                continue
            if isinstance(meta, dict):
                for key, value in meta.items():
                    out.setdefault(key, _json_kind(value))
        elif ext.endswith(".npy"):
            out[ext.removesuffix(".npy")] = IDS
        else:
            out[ext] = TEXT if ext in TEXT_MEMBERS or ext.endswith(".txt") else OTHER
    return out


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return IDS
    return OTHER


def detected_source(
    columns: dict[str, str], tokenizer: str | None, loss_on: str | None, where: str
) -> RecordSource:
    """The token source of a dataset whose columns are ``columns`` when the caller named none:
    stored ``input_ids``, else the kind :func:`~bcl_stream.records.registry.detect` finds
    (its :meth:`~bcl_stream.records.kind.RecordKind.declared` source). Refused in one line
    when nothing fits, or when a layout's text needs a tokenizer that was not given (or a
    tokenizer was given for ids, which it would not count)."""
    if DEFAULT_FIELD in columns:
        if tokenizer is not None or loss_on is not None:
            raise DatasetError(
                f"{where}: holds token ids in column {DEFAULT_FIELD!r}, which are counted as "
                "they are; --tokenizer and --loss-on are for a text or conversation column: "
                "drop them, or name that column with --text-field or --messages-field"
            )
        return RecordSource()
    found = declared_source(columns, tokenizer, loss_on, where)
    if found is None:
        raise DatasetError(
            f"{where}: no token column {DEFAULT_FIELD!r} and no layout preprocess recognises "
            "(a 'text' column, 'messages' or 'conversations', or 'prompt' with 'response' or "
            f"'completion') among its columns {sorted(columns)[:12]}; name the column with "
            "--tokens-field, --text-field/--messages-field with --tokenizer, or --length-field"
        )
    return found
