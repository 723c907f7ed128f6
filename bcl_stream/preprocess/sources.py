"""Input records: JSONL lines and Parquet rows, read in order, parsed in worker processes.

The reader in the main process does as little as possible (split lines, slice Parquet batches)
and hands chunks of raw records to the tokenizing workers: JSON parsing and UTF-8 decoding run
there, in parallel, and every failure comes back as a :class:`Bad` that names ``file:line``.
A record is a JSON object with a text field (``--text-field``) or a chat ``messages`` list.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.preprocess.chat import ChatFormatError, render_messages

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")

Raw = tuple[str, "bytes | dict[str, Any]"]
"""(source "file:line", a JSONL line's bytes or a Parquet row)."""


@dataclass(frozen=True, slots=True)
class Bad:
    """A record that could not be turned into text: why (a report key) and a message."""

    source: str
    reason: str
    message: str


def check_inputs(inputs: list[str]) -> None:
    """Refuse missing, empty or unsupported inputs before any work starts."""
    if not inputs:
        raise ValueError("no input files given")
    for path in inputs:
        if not os.path.isfile(path):
            raise DatasetError(f"{path}: no such input file")
        if not path.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES):
            raise ValueError(
                f"{path}: unsupported input type; expected JSONL ({', '.join(JSONL_SUFFIXES)}) "
                f"or Parquet ({', '.join(PARQUET_SUFFIXES)})"
            )


def _jsonl(path: str, counts: dict[str, int]) -> Iterator[Raw]:
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            counts["bytes_read"] += len(line)
            if line.strip():
                if number == 1 and line.lstrip().startswith(b"["):
                    raise DatasetError(
                        f"{path}:1: starts with '[': a JSON array, not JSON Lines. Write one "
                        "record object per line (for example with `jq -c '.[]'`)."
                    )
                yield f"{path}:{number}", line
            else:
                counts["blank_lines"] += 1


def _parquet(path: str, counts: dict[str, int]) -> Iterator[Raw]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from exc
    counts["bytes_read"] += os.path.getsize(path)
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            row += 1
            yield f"{path}:{row}", record


def read_records(
    inputs: list[str], counts: dict[str, int], empty: list[str] | None = None
) -> Iterator[Raw]:
    """Every raw record of every input, in order. An input with no record is an error, or,
    with ``empty`` given (``--skip-bad``), appended to it: a glob such as ``data/*.jsonl``
    may well catch an empty file."""
    for path in inputs:
        before = counts["records_read"]
        reader = _parquet if path.endswith(PARQUET_SUFFIXES) else _jsonl
        for raw in reader(path, counts):
            counts["records_read"] += 1
            yield raw
        if counts["records_read"] == before:
            if empty is None:
                raise DatasetError(
                    f"{path}: empty input (no records). Remove it from the inputs, or pass "
                    "--skip-bad to skip (and count) empty inputs."
                )
            empty.append(path)


def record_text(source: str, payload: bytes | dict[str, Any], text_field: str) -> str | Bad:
    """The text to tokenize for one raw record (worker side), or why there is none."""
    if isinstance(payload, bytes):
        try:
            line = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Bad(source, "undecodable", f"not valid UTF-8 at byte {exc.start} ({exc.reason})")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return Bad(source, "malformed_json", f"malformed JSON: {exc.msg} at column {exc.colno}")
    else:
        record = payload
    if not isinstance(record, dict):
        return Bad(source, "malformed_json", f"expected a JSON object, got {type(record).__name__}")
    if text_field in record:
        text = record[text_field]
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                return Bad(
                    source, "undecodable", f"field {text_field!r} is not valid UTF-8 ({exc})"
                )
        if not isinstance(text, str):
            return Bad(
                source,
                "bad_field",
                f"field {text_field!r} is a {type(text).__name__}, expected a string",
            )
    elif "messages" in record:
        try:
            text = render_messages(record["messages"])
        except ChatFormatError as exc:
            return Bad(source, "bad_messages", str(exc))
    else:
        return Bad(
            source,
            "missing_field",
            f"no {text_field!r} field and no 'messages' (fields: {sorted(record)[:8]}); "
            "pass --text-field NAME",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return Bad(source, "undecodable", f"text holds an unpaired surrogate at {exc.start}")
    if not text:
        return Bad(source, "empty_text", "the text is empty (0 tokens)")
    return text
