"""Input records: JSONL lines, Parquet rows and WebDataset tar records, read in order, parsed
in worker processes.

The reader in the main process does as little as possible (split lines, slice Parquet batches)
and hands chunks of raw records to the tokenizing workers: JSON parsing and UTF-8 decoding run
there, in parallel, and every failure comes back as a :class:`Bad` that names ``file:line``.
A record is a JSON object of one of the kinds ``records/registry.py`` reads (a text field,
a conversation, a prompt and its response, an image and its caption). A WebDataset tar's
record (img2dataset: ``NNN.jpg``, ``NNN.txt``, ``NNN.json``) becomes one object keyed by member
extension: ``txt`` decoded as UTF-8, ``json`` parsed, every other member its bytes; its source
is ``file.tar:KEY``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from bcl_stream.errors import DatasetError
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.records.kind import Bad
from bcl_stream.records.text import check_text
from bcl_stream.text.chat import ChatFormatError, render_messages

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
TAR_SUFFIXES = (".tar",)

Raw = tuple[str, "bytes | dict[str, Any]"]
"""(source "file:line", a JSONL line's bytes or a Parquet row)."""


def check_inputs(inputs: list[str]) -> None:
    """Refuse missing, empty or unsupported inputs before any work starts."""
    if not inputs:
        raise ValueError("no input files given")
    for path in inputs:
        if not os.path.isfile(path):
            raise DatasetError(f"{path}: no such input file")
        if not path.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES + TAR_SUFFIXES):
            raise ValueError(
                f"{path}: unsupported input type; expected JSONL ({', '.join(JSONL_SUFFIXES)}), "
                f"Parquet ({', '.join(PARQUET_SUFFIXES)}) or a WebDataset tar (.tar)"
            )


@dataclass(frozen=True, slots=True)
class InputSlice:
    """The records of one input file that one run reads: those whose first byte lies in
    ``[start, stop)`` (``stop`` None: to the end). Parquet rows count as ``size / rows`` bytes
    each, so a byte range is a row range. ``owns_start``: this run reports the file when it
    holds no record at all (exactly one of the runs that share a file does)."""

    path: str
    start: int = 0
    stop: int | None = None
    owns_start: bool = True

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop is None


def _line_number(fh: BinaryIO, offset: int) -> int:
    """Lines before byte ``offset`` (a line start): newlines counted in 16 MB reads, no
    parsing, at disk speed; ``source`` names must match a run over the whole file."""
    fh.seek(0)
    lines = 0
    left = offset
    while left > 0:
        block = fh.read(min(left, 16 << 20))
        if not block:
            break
        lines += block.count(b"\n")
        left -= len(block)
    return lines


BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark: read past at the start of a JSONL file, not part of line 1."""


def _jsonl(piece: InputSlice, counts: dict[str, int]) -> Iterator[Raw]:
    path = piece.path
    with open(path, "rb") as fh:
        position, number = 0, 1
        if piece.start > 0:  # start at the first line that begins at or after ``start``
            fh.seek(piece.start - 1)
            if fh.read(1) != b"\n":
                fh.readline()
            position = fh.tell()
            number = _line_number(fh, position) + 1
            fh.seek(position)
        stop = piece.stop
        first_line = number
        for number, line in enumerate(fh, start=first_line):
            if stop is not None and position >= stop:
                break
            position += len(line)
            counts["bytes_read"] += len(line)
            if number == 1 and line.startswith(BOM):  # written by some Windows tools
                line = line[len(BOM) :]
            if line.strip():
                if number == 1 and line.lstrip().startswith(b"["):
                    raise DatasetError(
                        f"{path}:1: starts with '[': a JSON array, not JSON Lines. Write one "
                        "record object per line (for example with `jq -c '.[]'`)."
                    )
                yield f"{path}:{number}", line
            else:
                counts["blank_lines"] += 1


def _parquet_file(path: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from exc


def _parquet(piece: InputSlice, counts: dict[str, int]) -> Iterator[Raw]:
    path = piece.path
    pf = _parquet_file(path)
    size = os.path.getsize(path)
    stop = size if piece.stop is None else piece.stop
    counts["bytes_read"] += stop - piece.start
    rows = pf.metadata.num_rows
    # row r "starts" at byte r * size / rows: the rows whose start lies in [start, stop)
    first = -(-piece.start * rows // size) if size else 0
    last = -(-stop * rows // size) if size else rows
    groups: list[int] = []
    row = seen = 0
    for g in range(pf.metadata.num_row_groups):  # only the row groups that hold our rows
        n = pf.metadata.row_group(g).num_rows
        if seen + n > first and seen < last:
            row = seen if not groups else row  # rows before the first group read
            groups.append(g)
        seen += n
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=1024, row_groups=groups):
        for record in batch.to_pylist():
            row += 1
            if first < row <= last:
                yield f"{path}:{row}", record


def _tar(piece: InputSlice, counts: dict[str, int]) -> Iterator[Raw]:
    """A WebDataset tar's records (see the module docstring), whole files only."""
    if not piece.whole:
        raise DatasetError(
            f"{piece.path}: a WebDataset tar input is read whole; --part cannot split it "
            "(preprocess tars in one run, or give each part its own tars)"
        )
    try:
        for key, members in tar_records(Path(piece.path)):
            counts["bytes_read"] += sum(len(payload) for _, payload in members)
            yield f"{piece.path}:{key}", tar_record(members)
    except TAR_ERRORS as exc:
        raise DatasetError(f"{piece.path}: not a readable tar ({exc})") from exc


def tar_record(members: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
    """A WebDataset record's members (extension, bytes) as the record preprocessing reads:
    ``txt`` decoded, ``json`` parsed (kept as bytes when it is not JSON), the rest as bytes.
    ``annotate --processor`` reads a tar in place through it, so both see the same record."""
    record: dict[str, Any] = {}
    for ext, payload in members:
        if ext == "txt":
            record[ext] = payload.decode("utf-8", "replace")
        elif ext == "json":
            try:
                record[ext] = json.loads(payload)
            except ValueError:
                record[ext] = payload
        else:
            record[ext] = payload
    return record


def _has_records(path: str) -> bool:
    """Whether a file holds any record (a non-blank line, a Parquet row, a tar member)."""
    if path.endswith(PARQUET_SUFFIXES):
        return bool(_parquet_file(path).metadata.num_rows)
    if path.endswith(TAR_SUFFIXES):
        return any(True for _ in tar_records(Path(path)))
    with open(path, "rb") as fh:
        return any(line.strip() for line in fh)


def read_records(
    inputs: Sequence[str | InputSlice], counts: dict[str, int], empty: list[str] | None = None
) -> Iterator[Raw]:
    """Every raw record of every input (whole files or :class:`InputSlice`), in order. An
    input with no record is an error, or, with ``empty`` given (``--skip-bad``), appended to
    it: a glob such as ``data/*.jsonl`` may well catch an empty file."""
    for item in inputs:
        piece = item if isinstance(item, InputSlice) else InputSlice(item)
        before = counts["records_read"]
        reader = (
            _parquet
            if piece.path.endswith(PARQUET_SUFFIXES)
            else _tar
            if piece.path.endswith(TAR_SUFFIXES)
            else _jsonl
        )
        for raw in reader(piece, counts):
            counts["records_read"] += 1
            yield raw
        if (
            counts["records_read"] == before
            and piece.owns_start
            and (piece.whole or not _has_records(piece.path))
        ):
            if empty is None:
                raise DatasetError(
                    f"{piece.path}: empty input (no records). Remove it from the inputs, or "
                    "pass --skip-bad to skip (and count) empty inputs."
                )
            empty.append(piece.path)


def parse_payload(source: str, payload: bytes | dict[str, Any]) -> dict[str, Any] | Bad:
    """A raw record (a JSONL line's bytes, or a Parquet row) as a JSON object, or why not."""
    if isinstance(payload, bytes):
        try:
            line = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Bad(source, "undecodable", f"not valid UTF-8 at byte {exc.start} ({exc.reason})")
        try:
            record = json.loads(line)
        except RecursionError:
            # json's decoder recurses once per nesting level: a line nested past Python's
            # recursion limit (about 1,000 levels) is a bad record, not a crash of the run
            return Bad(
                source,
                "malformed_json",
                "JSON nested too deeply to parse (arrays or objects about 1,000 levels deep)",
            )
        except json.JSONDecodeError as exc:
            # json's own messages may end in "at" ("Unterminated string starting at"): the
            # column goes first so the sentence never reads "at at column".
            what = exc.msg.removesuffix(" at")
            return Bad(source, "malformed_json", f"malformed JSON at column {exc.colno}: {what}")
    else:
        record = payload
    if not isinstance(record, dict):
        return Bad(source, "malformed_json", f"expected a JSON object, got {type(record).__name__}")
    return record


def record_text(source: str, payload: bytes | dict[str, Any], text_field: str) -> str | Bad:
    """The text of one raw record under the built-in ChatML (a text field, or ``messages``
    with string contents), or why there is none. ``preprocess`` itself reads every layout
    (``records/registry.py``); this is the plain-text view of the two original ones."""
    record = parse_payload(source, payload)
    if isinstance(record, Bad):
        return record
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
    return check_text(source, text)
