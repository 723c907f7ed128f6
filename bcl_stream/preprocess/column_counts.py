"""Token counts of an existing dataset's records, one shard at a time (``annotate``).

What is counted (:class:`Counting`): the ids of a token column (:class:`RecordSource`: any
name, an integer array or raw integer bytes of a declared dtype), the tokens of a text column
under a tokenizer, or an integer length column. Anything else is refused before a record is
read, in one line naming the column, what it holds and which option fits: a ``str`` column
counted as tokens gives characters, llm-foundry's ``int64`` bytes give 8x the tokens.

A length column is trusted only after a check: in a sample of shards (``check=True``; the
caller picks them with :func:`spread`) it is compared with the token counts of the column the
readers will read, and a mismatch is refused at annotate time (before, it failed at read time
with advice that could not fix it).

Per shard (``mds_shard_counts``, ``wds_shard_counts``), so a caller may count shards in
parallel (``annotate --workers``). MDS columns are read from the raw shard bytes where the encoding allows
(``formats/mds_lengths.py``, no streaming import); otherwise decoded with streaming's reader.
"""

from __future__ import annotations

import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_lengths import column_bytes, shard_counts
from bcl_stream.formats.npy import load_npy
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.formats.token_ids import (
    INTEGER_SCALARS,
    length_value,
    token_count,
    wds_column,
)
from bcl_stream.io import streaming_compat
from bcl_stream.io.dataset_dir import MDS_INDEX
from bcl_stream.io.hashing import record_digest
from bcl_stream.preprocess import trained_counts as tc
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import LOSS_SPANS

LENGTH_CHECK_SHARDS = 4
"""Shards (evenly spread, first and last included) whose records check a length column."""
LENGTH_CHECK_RECORDS = 64
"""Records per checked shard when the token column is text (each is tokenized)."""


@dataclass(frozen=True, slots=True)
class Counting:
    """What ``annotate`` counts: ``source``'s tokens, or ``length_field``'s values (then
    checked against ``source`` on a sample, when the records have its column)."""

    source: RecordSource = field(default_factory=RecordSource)
    length_field: str | None = None

    @property
    def field(self) -> str:
        return self.length_field or self.source.field

    def record(self) -> dict[str, Any]:
        """What the cost index records (``extra.annotate``): the reader's token source, and
        the length column when one was counted."""
        out: dict[str, Any] = {"tokens_field": self.source.tokens_field, **self.source.to_dict()}
        if self.source.is_text or self.source.is_conversation or self.source.processor:
            out.pop("tokens_field")
        if self.length_field is not None:
            out["length_field"] = self.length_field
        return out


def check_encoding(where: str, column: str, encoding: str, counting: Counting) -> None:
    """Refuse a column whose MDS encoding cannot hold what ``counting`` reads from it."""
    kind = encoding.split(":")[0]
    if counting.length_field is not None and column == counting.length_field:
        if encoding not in INTEGER_SCALARS:
            raise DatasetError(
                f"{where}: length field {column!r} is a {encoding!r} column, not an integer; "
                "--length-field takes a column of token counts (use --tokens-field for token "
                "ids, --text-field with --tokenizer for text)"
            )
        return
    source = counting.source
    if source.is_text:
        if kind not in ("str", "bytes"):
            raise DatasetError(
                f"{where}: text field {column!r} is a {encoding!r} column, not text (str); "
                "for token ids use --tokens-field"
            )
        return
    if kind == "ndarray":
        dtype = encoding.split(":")[1] if ":" in encoding else ""
        if dtype and not np.issubdtype(np.dtype(dtype), np.integer):
            raise DatasetError(
                f"{where}: token column {column!r} holds {dtype} values ({encoding!r}), not "
                "integer token ids"
            )
        return
    if kind == "bytes":
        if source.tokens_dtype is None:
            raise DatasetError(
                f"{where}: token column {column!r} holds raw bytes: pass their integer dtype "
                "with --tokens-dtype (int64 for llm-foundry's concat_tokens 'tokens'); counted "
                "as they are, bytes would be taken for tokens"
            )
        return
    if kind == "str":
        raise DatasetError(
            f"{where}: token column {column!r} is a str column (text), not token ids: counted "
            f"as it is, it gives characters. Count its tokens with --text-field {column} "
            "--tokenizer cl100k (or a tokenizer.json)"
        )
    if encoding in INTEGER_SCALARS:
        raise DatasetError(
            f"{where}: token column {column!r} is one integer per record ({encoding!r}); if "
            f"it is the record's length, pass --length-field {column}"
        )
    raise DatasetError(
        f"{where}: column {column!r} is a {encoding!r} column, not integer token ids (ndarray "
        "of integers, or bytes with --tokens-dtype)"
    )


def _mds_check(root: Path, shard: dict[str, Any], column: str, counting: Counting) -> None:
    names = list(shard.get("column_names") or [])
    if column not in names:
        raise DatasetError(
            f"{root / MDS_INDEX}: no column {column!r} (columns: {names}); pass "
            "--tokens-field, --text-field or --length-field with one of them"
        )
    encodings = list(shard.get("column_encodings") or [])
    if len(encodings) == len(names):
        check_encoding(str(root / MDS_INDEX), column, str(encodings[names.index(column)]), counting)


def decoded_values(
    root: Path, shard: dict[str, Any], column: str | None, limit: int | None
) -> list[Any]:
    """Column values of a shard decoded with streaming's reader (any encoding, compressed
    shards too), the first ``limit`` samples (None: all); ``column`` None: whole records."""
    raw = shard["raw_data"]["basename"]
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
        n = int(shard["samples"]) if limit is None else min(limit, int(shard["samples"]))
        items = (reader.get_item(i) for i in range(n))
        return [item if column is None else item[column] for item in items]


def spread(items: list[int], k: int) -> list[int]:
    """Up to ``k`` of ``items``, evenly spread, the first and the last included."""
    if len(items) <= k:
        return list(items)
    picks = np.unique(np.linspace(0, len(items) - 1, k).round().astype(int))
    return [items[i] for i in picks.tolist()]


def _mds_counts(
    root: Path, shard: dict[str, Any], counting: Counting, limit: int | None = None
) -> list[int]:
    """Counts of one MDS shard's records (the first ``limit``; None: all)."""
    column, raw = counting.field, shard["raw_data"]["basename"]
    _mds_check(root, shard, column, counting)
    as_length = counting.length_field is not None
    source = counting.source
    values: list[Any] | None = None
    if not source.is_text:
        fast = shard_counts(root / raw, shard, column, as_length, source.tokens_dtype)
        if fast is not None:
            return fast if limit is None else fast[:limit]
    else:
        values = column_bytes(root / raw, shard, column)
    if values is None:
        values = decoded_values(root, shard, column, limit)
    values = values if limit is None else values[:limit]
    if as_length:
        return [length_value(v, column, f"{raw} sample {i}") for i, v in enumerate(values)]
    return [token_count(v, source, f"{raw} sample {i}") for i, v in enumerate(values)]


def mds_shard_counts(
    root: Path, shard: dict[str, Any], counting: Counting, *, check: bool = False
) -> tuple[list[int], list[int] | None, int]:
    """(counts of one MDS shard's records, their trained counts (None: no mask, every token
    trained; ``preprocess/trained_counts.py``), records on which a length column was checked
    against the token column: with ``check``, when the shard has that column)."""
    source = counting.source
    if tc.encoded_in_place(source):
        enc_counts, enc_trained = _mds_encoded(root, shard, source)
        return enc_counts, enc_trained, 0
    if source.response_field is not None:
        pr_counts, pr_trained = _mds_prompt_response(root, shard, source)
        return pr_counts, pr_trained, 0
    counts = _mds_counts(root, shard, counting)
    trained: list[int] | None = None
    if tc.mds_has_spans(shard):
        raw = shard["raw_data"]["basename"]
        spans = decoded_values(root, shard, LOSS_SPANS, None)
        trained = [tc.spans_trained(v, counts[i], f"{raw} sample {i}") for i, v in enumerate(spans)]
    if not check or counting.length_field is None:
        return counts, trained, 0
    if source.field not in list(shard.get("column_names") or []):
        return counts, trained, 0  # no token column to compare with
    limit = LENGTH_CHECK_RECORDS if source.is_text else None  # text: each one is tokenized
    tokens = _mds_counts(root, shard, Counting(source), limit)
    raw = shard["raw_data"]["basename"]
    for i, n in enumerate(tokens):
        if counts[i] != n:
            raise _mismatch(f"{raw} sample {i}", counting, counts[i], n)
    return counts, trained, len(tokens)


def _mds_prompt_response(
    root: Path, shard: dict[str, Any], source: RecordSource
) -> tuple[list[int], list[int]]:
    """(tokens, trained) of a prompt/response shard of stored ids, counted column by column
    (no record is built): the prompt's and the response's ids, the response trained."""
    tc.check_response_column(root, shard, source)
    prompt = _mds_counts(root, shard, Counting(tc.prompt_source(source)))
    response = _mds_counts(root, shard, Counting(tc.response_source(source)))
    return (
        [p + r for p, r in zip(prompt, response, strict=True)],
        [tc.ids_trained(p, r) for p, r in zip(prompt, response, strict=True)],
    )


def _mds_encoded(
    root: Path, shard: dict[str, Any], source: RecordSource
) -> tuple[list[int], list[int]]:
    """(tokens, trained) of a shard whose records are encoded one at a time, as the readers
    will build them (:func:`~bcl_stream.preprocess.trained_counts.encoded_in_place`)."""
    tc.check_response_column(root, shard, source)
    raw = shard["raw_data"]["basename"]
    columns = []
    for name in source.fields:
        values = column_bytes(root / raw, shard, name)
        columns.append(values if values is not None else decoded_values(root, shard, name, None))
    pairs = [
        tc.stored_record(values, source, f"{raw} sample {i}")
        for i, values in enumerate(zip(*columns, strict=True))
    ]
    return [n for n, _ in pairs], [t for _, t in pairs]


def wds_shard_counts(
    root: Path, name: str, counting: Counting, *, check: bool = False
) -> tuple[list[int], list[int], array[int], int]:
    """(counts, trained counts, one record hash each, records on which a length column was
    checked: the first :data:`LENGTH_CHECK_RECORDS` with ``check``, when they have the token
    column) of one WebDataset tar, in file order. A record's trained count comes from its
    ``loss_spans.npy`` member or its prompt/response columns, else ``max(L - 1, 0)``."""
    counts: list[int] = []
    trained: list[int] = []
    hashes = array("Q")
    checked = 0
    as_length = counting.length_field is not None
    try:
        for i, (key, member_list) in enumerate(tar_records(root / name)):
            members = dict(member_list)
            where = f"{name} sample {key}"
            hashes.append(record_digest(members.items()))
            source = counting.source
            if tc.encoded_in_place(source) or source.response_field is not None:
                values = [wds_column(members, f, where) for f in source.fields]
                if tc.encoded_in_place(source):
                    n, t = tc.stored_record(values, source, where)
                else:
                    n, t = _wds_prompt_response(values[0], values[1], source, where)
                counts.append(n)
                trained.append(t)
                continue
            value = wds_column(members, counting.field, where)
            if as_length:
                counts.append(length_value(value, counting.field, where))
                if check and i < LENGTH_CHECK_RECORDS and _has(members, counting.source.field):
                    tokens = wds_column(members, counting.source.field, where)
                    n = token_count(tokens, counting.source, where)
                    if n != counts[-1]:
                        raise _mismatch(where, counting, counts[-1], n)
                    checked += 1
            else:
                counts.append(token_count(value, counting.source, where))
            spans = members.get(f"{LOSS_SPANS}.npy")
            trained.append(
                max(counts[-1] - 1, 0)
                if spans is None
                else tc.spans_trained(load_npy(spans), counts[-1], where)
            )
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{root / name}: unreadable tar shard ({exc}); re-download or rewrite the shard"
        ) from exc
    return counts, trained, hashes, checked


def _wds_prompt_response(
    prompt: Any, response: Any, source: RecordSource, where: str
) -> tuple[int, int]:
    """(tokens, trained) of a prompt/response record of stored ids, without building it."""
    p = token_count(prompt, tc.prompt_source(source), where)
    r = token_count(response, tc.response_source(source), where)
    return p + r, tc.ids_trained(p, r)


def _has(members: dict[str, bytes], field: str) -> bool:
    """Whether a WebDataset record has ``field`` (a member, ``.npy``, or a json key)."""
    try:
        wds_column(members, field, "")
    except DatasetError:
        return False
    return True


def _mismatch(where: str, counting: Counting, stored: int, counted: int) -> DatasetError:
    return DatasetError(
        f"{where}: length field {counting.length_field!r} says {stored} tokens but its "
        f"{counting.source.describe()} holds {counted}: the readers read that column, so the "
        "plan's costs would be wrong. Annotate from the token column instead "
        f"(--tokens-field / --text-field, without --length-field), or fix the length column"
    )
