"""A record's token ids from its column, by :class:`~bcl_stream.records.source.RecordSource`:
one set of rules for ``annotate`` (which counts) and the readers (which yield ids), so a count
in the cost index is by construction the length the reader yields.

- token ids: an integer array (any name, any integer dtype), or raw bytes read as
  ``tokens_dtype`` (llm-foundry's ``tokens``: ``int64``). A text, float, scalar or byte column
  without a dtype is refused in one line that says which option fits instead: counting its
  characters or bytes as tokens (what ``len`` gives) would cost the plan with wrong numbers.
- text: a ``str`` (or UTF-8 bytes) tokenized with the source's tokenizer, no special tokens
  added (:mod:`bcl_stream.text.tokenizers`); the tokenizer loads once per process.

Values quoted in messages are cut to :data:`QUOTE` characters.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError
from bcl_stream.formats.npy import load_npy
from bcl_stream.io.index import CostIndex
from bcl_stream.records.source import KEYS, RecordSource
from bcl_stream.text.tokenizers import load_tokenizer, tokenizer_identity

QUOTE = 60
"""Characters of a value quoted in an error message."""
INTEGER_SCALARS = ("int", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
"""MDS encodings of an integer scalar (a length column)."""
TEXT_MEMBERS = ("txt", "text")
"""WebDataset member suffixes that hold UTF-8 text (as ``webdataset`` and our reader decode)."""


def quote(value: Any) -> str:
    """``repr(value)`` cut to :data:`QUOTE` characters: an error is one line, not a document."""
    text = repr(value)
    return text if len(text) <= QUOTE else f"{text[:QUOTE]}... ({len(text)} characters)"


@functools.cache
def _tokenizer(spec: str) -> Any:
    return load_tokenizer(spec)


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    return f"a {type(value).__name__}"


def token_ids(value: Any, source: RecordSource, where: str) -> npt.NDArray[np.integer[Any]]:
    """The token ids ``value`` (a record's ``source.field``) holds, as a 1-D integer array."""
    if source.is_text:
        value = as_text(
            value, None, source, where,
            hint="; for token ids use tokens_field (annotate --tokens-field) instead",
        )  # fmt: skip
        assert source.tokenizer is not None
        ids: npt.NDArray[np.integer[Any]] = _tokenizer(source.tokenizer).ids(value)
        return ids
    if isinstance(value, bytes | bytearray | memoryview):
        if source.tokens_dtype is None:
            raise DatasetError(
                f"{where}: token column {source.tokens_field!r} holds raw bytes ({len(value)} "
                "bytes), not an integer array: declare the integer type they hold "
                "(annotate --tokens-dtype / tokens_dtype, e.g. int64 for llm-foundry's "
                "'tokens'); counting bytes as tokens would be wrong"
            )
        dtype = np.dtype(source.tokens_dtype)
        if len(value) % dtype.itemsize:
            raise DatasetError(
                f"{where}: token column {source.tokens_field!r} holds {len(value)} bytes, not a "
                f"whole number of {source.tokens_dtype} ids; is tokens_dtype right?"
            )
        return _in_range(np.frombuffer(value, dtype=dtype), source, where)
    if isinstance(value, str):
        raise DatasetError(
            f"{where}: token column {source.tokens_field!r} holds text ({quote(value)}), not "
            "token ids; tokenize it: annotate --text-field NAME --tokenizer cl100k (and "
            "text_field / tokenizer on the reader)"
        )
    arr = np.asarray(value)
    if arr.ndim == 0 and np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(
            f"{where}: column {source.tokens_field!r} holds one integer ({int(arr)}), not token "
            "ids; if it is a record's length, annotate with --length-field instead"
        )
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise DatasetError(
            f"{where}: token column {source.tokens_field!r} holds {_kind(value)} of shape "
            f"{arr.shape}, not a 1-D array of integer token ids"
        )
    return _in_range(arr, source, where)


ID_LIMIT = 2**32
"""No vocabulary holds this many ids: a token id outside ``[0, ID_LIMIT)`` is damage (or a
label column such as ``-100`` padding read as ids), and would be an out-of-range embedding
lookup at training time (a device assert on a GPU, far from the record)."""


def _in_range(
    ids: npt.NDArray[np.integer[Any]], source: RecordSource, where: str
) -> npt.NDArray[np.integer[Any]]:
    """``ids`` if every id lies in ``[0, ID_LIMIT)`` (checked only where the dtype allows
    anything else), else a :class:`DatasetError` naming the record, the id and its position."""
    kind, size = ids.dtype.kind, ids.dtype.itemsize
    if not ids.size or (kind == "u" and size <= 4):
        return ids
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < ID_LIMIT:
        return ids
    bad = low if low < 0 else high
    at = int(np.flatnonzero(ids == bad)[0])
    raise DatasetError(
        f"{where}: token column {source.tokens_field!r} holds token id {bad} at position {at}, "
        f"outside [0, {ID_LIMIT}): no vocabulary is that large (a label column, padding or "
        "damaged bytes?); it would be an out-of-range embedding lookup in training. Fix the "
        "column or name the right one (tokens_field / --tokens-field)"
    )


def token_count(value: Any, source: RecordSource, where: str) -> int:
    """len(:func:`token_ids`) without building the ids where the bytes tell (raw columns)."""
    if isinstance(value, bytes) and not source.is_text and source.tokens_dtype is not None:
        size = np.dtype(source.tokens_dtype).itemsize
        if len(value) % size == 0:
            _in_range(np.frombuffer(value, dtype=source.tokens_dtype), source, where)
            return len(value) // size
    return int(token_ids(value, source, where).size)


def length_value(value: Any, field: str, where: str) -> int:
    """An integer length column's value (``annotate --length-field``), refusing anything else."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace").strip()
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise DatasetError(
            f"{where}: length field {field!r} holds {_kind(value)} ({quote(value)}), not an "
            "integer; --length-field takes a column of token counts (use --tokens-field for "
            "token ids, --text-field with --tokenizer for text)"
        )
    if value < 0:
        raise DatasetError(f"{where}: length field {field!r} is negative ({int(value)})")
    return int(value)


def record_column(record: Mapping[str, Any], field: str, where: str) -> Any:
    """A decoded record's ``field``: a column (MDS), a member (WebDataset, ``field`` or
    ``field.npy``), or a key of its ``json`` member."""
    if field in record:
        return record[field]
    meta = record.get("json")
    if isinstance(meta, dict) and field in meta:
        return meta[field]
    raise DatasetError(
        f"{where}: no column {field!r} (the record has {sorted(record)}); name the token "
        "column with tokens_field (or a text column with text_field and tokenizer)"
    )


def wds_column(members: Mapping[str, bytes], field: str, where: str) -> Any:
    """A WebDataset record's ``field`` from its raw members (``annotate``, no decoding library):
    ``<field>.npy`` as an array, a ``<field>`` member as bytes, or a key of the json member."""
    if f"{field}.npy" in members:
        return load_npy(members[f"{field}.npy"])
    if field in members:
        if field in TEXT_MEMBERS or field.endswith(".txt"):  # decoded as webdataset does
            try:
                return members[field].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{where}: member .{field} is not UTF-8 text ({exc})") from exc
        return members[field]
    if "json" in members:
        try:
            meta = json.loads(members["json"])
        except ValueError as exc:
            raise DatasetError(f"{where}: its json member is not JSON ({exc})") from exc
        if isinstance(meta, dict) and field in meta:
            return meta[field]
    raise DatasetError(
        f"{where}: no member {field}.npy or {field}, and no {field!r} in a json member "
        f"(members: {sorted(members)}); pass --tokens-field, --text-field or --length-field"
    )


def recorded_source(index: CostIndex) -> RecordSource | None:
    """The token source a cost index was counted from (``annotate`` records it), or None: the
    ``input_ids`` column (``preprocess``), or a length column checked against no token column."""
    record = index.extra.get("annotate")
    if not isinstance(record, dict):
        return None
    if "length_field" in record and not index.extra.get("length_check", {}).get("records"):
        return None
    try:
        return RecordSource.of({k: record[k] for k in KEYS if k in record})
    except ValueError:
        return None  # an index written before sources were recorded: nothing to compare


def resolve_source(
    configured: RecordSource | None, index: CostIndex, location: str
) -> RecordSource | None:
    """The source a reader reads: ``configured``, or the one the index was counted from. A
    configured source that differs from the recorded one (another column, dtype, or a
    tokenizer with other content) is refused: the plan would balance counts the reader does not
    yield."""
    recorded = recorded_source(index)
    if configured is None:
        return recorded
    if recorded is None or _same(configured, recorded, index):
        return configured
    raise DatasetError(
        f"{location}: the cost index counted the {recorded.describe()}, but the reader is set "
        f"to read the {configured.describe()}: the plan would balance other token counts than "
        f"the ones trained on. Read {_settings(recorded)}, or re-run `bcl-stream annotate "
        f"--overwrite` with the reader's column"
    )


def _same(configured: RecordSource, recorded: RecordSource, index: CostIndex) -> bool:
    if configured.tokenizer is None or recorded.tokenizer is None:
        return configured == recorded
    stored = index.extra.get("annotate", {}).get("tokenizer_id")
    if stored is not None and tokenizer_identity(configured.tokenizer) != stored:
        return False
    return replace(configured, tokenizer=recorded.tokenizer) == recorded


def _settings(source: RecordSource) -> str:
    given = source.to_dict() or {"tokens_field": source.tokens_field}
    return ", ".join(f"{k}={v!r}" for k, v in given.items())


def as_text(value: Any, field: str | None, source: RecordSource, where: str, hint: str = "") -> str:
    """``value`` as text (UTF-8 bytes decoded), else a :class:`DatasetError` naming the column
    (``field``; None: the source's own text column) and ending with ``hint``."""
    column = "text column" if field is None else f"column {field!r}"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{where}: {column} is not valid UTF-8 ({exc})") from exc
    if not isinstance(value, str):
        held = f"holds {_kind(value)}, not text{hint}"
        raise DatasetError(
            f"{where}: {source.describe()} {held}"
            if field is None
            else f"{where}: {source.describe()}: {column} {held}"
        )
    return value
