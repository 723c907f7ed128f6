"""Trained-token counts of an existing dataset's records, one shard at a time (``annotate``).

Two layouts carry what is trained without a rewrite:

- a stored ``loss_spans`` column (MDS ``ndarray:uint32``) or member (WebDataset
  ``<key>.loss_spans.npy``), as ``preprocess`` writes it: each record's trained count is its
  spans' (:mod:`bcl_stream.text.loss_spans`), checked against the record's token count;
- prompt/response columns (``RecordSource.response_field``, llm-foundry's finetuning layout as
  its converter writes it with stock ``MDSWriter``): the readers build ``input_ids`` = prompt
  ids + response ids and ``loss_spans`` = the response (``records/prompt_response.py``), so the
  count is the response's (and, for text, its EOS). The token count is computed here too;
- a conversation column (``RecordSource.messages_field``): rendered with the tokenizer's chat
  template as ``preprocess`` renders it, its mask by ``loss_on``; the readers render it the
  same way on every read.

Anything else trains every token: no counts (the index then stores ``max(L - 1, 0)``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.records.chat import CHAT
from bcl_stream.records.prompt_response import prompt_response_ids
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import LOSS_SPANS, LossSpansError, check_spans, trained_count
from bcl_stream.text.templates import encoder_for


def response_source(source: RecordSource) -> RecordSource:
    """The response column read as the only column, like the prompt (ids or text)."""
    assert source.response_field is not None
    if source.is_text:
        return replace(source, text_field=source.response_field, response_field=None)
    return replace(source, tokens_field=source.response_field, response_field=None)


def prompt_source(source: RecordSource) -> RecordSource:
    return replace(source, response_field=None)


def ids_trained(prompt: int, response: int) -> int:
    """Trained tokens of a prompt/response record of stored ids (spans ``[p, p + r]``)."""
    if not response:
        return 0
    return trained_count([prompt, prompt + response], prompt + response)


def spans_trained(spans: Any, tokens: int, where: str) -> int:
    """A stored mask's trained count, refusing one that breaks the stored form."""
    try:
        return trained_count(check_spans(spans, tokens), tokens)
    except LossSpansError as exc:
        raise DatasetError(
            f"{where}: {exc}; fix the dataset's {LOSS_SPANS} (or drop the column)"
        ) from exc


def text_record(prompt: Any, response: Any, source: RecordSource, where: str) -> tuple[int, int]:
    """(tokens, trained) of a text prompt/response record, as the readers will build it."""
    ids, spans = prompt_response_ids(prompt, response, source, where, encoder_for)
    return int(ids.size), trained_count(spans, int(ids.size))


def conversation_record(value: Any, source: RecordSource, where: str) -> tuple[int, int]:
    """(tokens, trained) of a stored conversation, as the readers will render it."""
    ids, spans = CHAT.stored([value], source, where, encoder_for)
    return int(ids.size), trained_count(spans, int(ids.size))


def mds_has_spans(shard: dict[str, Any]) -> bool:
    return LOSS_SPANS in list(shard.get("column_names") or [])


def check_response_column(root: Path, shard: dict[str, Any], source: RecordSource) -> None:
    """Refuse a shard that lacks a column the source reads (naming the columns it has)."""
    names = list(shard.get("column_names") or [])
    for name in source.fields:
        if name not in names:
            raise DatasetError(
                f"{root / 'index.json'}: no column {name!r} for the {source.describe()} "
                f"(columns: {names})"
            )
