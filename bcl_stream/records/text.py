"""The text kind: one text field, pretraining-style, every token trained.

A record is text when it has the text field (``--text-field`` / ``text_field``, default
``text``) and no messages field is named; it is tokenized with no special tokens added. An
existing dataset read with this kind holds either that text (tokenized on every read with
``tokenizer``) or token ids (``tokens_field``, ``tokens_dtype``: read as they are,
``formats/token_ids.py``). Its knobs: ``text_field``, ``tokenizer``, ``tokens_field``,
``tokens_dtype``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from bcl_stream.formats.token_ids import token_ids
from bcl_stream.records.kind import (
    Bad,
    Encoders,
    FoundColumns,
    Ids,
    LayoutOptions,
    needs_tokenizer,
    no_loss_on,
)
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import Encoded, Encoder


@dataclass(frozen=True, slots=True)
class Text:
    text: str


def check_text(source: str, text: str) -> str | Bad:
    """``text`` if it can be tokenized (valid UTF-8, not empty), else why not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return Bad(source, "undecodable", f"text holds an unpaired surrogate at {exc.start}")
    if not text:
        return Bad(source, "empty_text", "the text is empty (0 tokens)")
    return text


class TextKind:
    """A text field (the module docstring)."""

    name = "text"
    shape: type = Text
    what = "a text column"
    knobs: tuple[str, ...] = ("text_field", "tokenizer", "tokens_field", "tokens_dtype")

    def detect(self, names: Collection[str], options: LayoutOptions) -> tuple[str, ...] | None:
        if options.text_field in names and options.messages_field is None:
            return (options.text_field,)
        return None

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        name = fields[0]
        text = record[name]
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                return Bad(where, "undecodable", f"field {name!r} is not valid UTF-8 ({exc})")
        if not isinstance(text, str):
            return Bad(
                where,
                "bad_field",
                f"field {name!r} is a {type(text).__name__}, expected a string",
            )
        checked = check_text(where, text)
        return checked if isinstance(checked, Bad) else Text(checked)

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        return Encoded(encoder.tokenizer.ids(shape.text))

    def declared(self, found: FoundColumns) -> RecordSource:
        spec = needs_tokenizer(self, found)
        no_loss_on(found)
        return RecordSource(text_field=found.fields[0], tokenizer=spec)

    def reads(self, source: RecordSource) -> bool:
        return source.messages_field is None and source.response_field is None

    def stored(
        self, values: Sequence[Any], source: RecordSource, where: str, encoders: Encoders
    ) -> Ids:
        return token_ids(values[0], source, where), None


TEXT = TextKind()
