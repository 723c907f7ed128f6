"""The record-kind seam (``bcl_stream/records/``): every kind implements the protocol, the
registry's detection order is the documented one, and a kind added to the registry is read
and encoded by ``preprocess``'s worker path without touching it (docs/extending.md)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bcl_stream.cli import build_parser
from bcl_stream.preprocess.work import EncodeOptions, tokenize_stream
from bcl_stream.records import registry
from bcl_stream.records.kind import Bad, Encoders, FoundColumns, Ids, LayoutOptions
from bcl_stream.records.source import RecordSource
from bcl_stream.text.chat import Conversation
from bcl_stream.text.templates import Encoded, Encoder
from tests.hf_tokenizers import CHATML, LLAMA3, build_tokenizer_dir

KNOBS = {f.name for f in fields(RecordSource)}


def test_every_kind_names_its_shape_and_knobs() -> None:
    names = [kind.name for kind in registry.KINDS]
    assert names == ["text", "messages", "prompt_response", "image_text"]  # detection order
    for kind in registry.KINDS:
        assert set(kind.knobs) <= KNOBS, kind.name
        assert registry.kind_named(kind.name) is kind
        assert isinstance(kind.what, str) and kind.what


def test_a_source_is_read_by_one_kind() -> None:
    assert registry.kind_reading(RecordSource()).name == "text"
    assert registry.kind_reading(RecordSource(text_field="t", tokenizer="cl100k")).name == "text"
    pr = RecordSource(tokens_field="prompt", response_field="response")
    assert registry.kind_reading(pr).name == "prompt_response"
    chat = RecordSource(messages_field="messages", tokenizer="cl100k")
    assert registry.kind_reading(chat).name == "messages"


def test_declared_source_follows_the_columns() -> None:
    text = registry.declared_source({"text": "text"}, "cl100k", None, "d")
    assert text == RecordSource(text_field="text", tokenizer="cl100k")
    ids = registry.declared_source({"prompt": "ids", "response": "ids"}, None, None, "d")
    assert ids == RecordSource(tokens_field="prompt", response_field="response")
    assert registry.declared_source({"body": "text"}, "cl100k", None, "d") is None


@dataclass(frozen=True, slots=True)
class Shout:
    text: str


class ShoutKind:
    """A toy kind: a ``shout`` field, tokenized upper-cased."""

    name = "shout"
    what = "a shout column"
    knobs: tuple[str, ...] = ("tokenizer",)
    shape: type = Shout

    def detect(self, names: Collection[str], options: LayoutOptions) -> tuple[str, ...] | None:
        return ("shout",) if "shout" in names else None

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        value = record[fields[0]]
        if not isinstance(value, str):
            return Bad(where, "bad_field", "a shout is text")
        return Shout(value)

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        return Encoded(encoder.tokenizer.ids(shape.text.upper()))

    def declared(self, found: FoundColumns) -> RecordSource:
        raise NotImplementedError

    def reads(self, source: RecordSource) -> bool:
        return False

    def stored(
        self, values: Sequence[Any], source: RecordSource, where: str, encoders: Encoders
    ) -> Ids:
        raise NotImplementedError


def test_a_registered_kind_is_read_and_encoded_by_preprocess(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, ShoutKind()))
    raws = [
        ("f:1", json.dumps({"shout": "hello there"}).encode()),
        ("f:2", json.dumps({"shout": 5}).encode()),
        ("f:3", json.dumps({"text": "plain"}).encode()),  # an earlier kind still comes first
    ]
    out = dict(
        tokenize_stream(iter(raws), EncodeOptions(RecordSource(tokenizer="cl100k")), workers=1)
    )
    encoder = Encoder("cl100k")
    first = out["f:1"]
    assert isinstance(first, Encoded) and first.spans is None
    np.testing.assert_array_equal(first.ids, encoder.tokenizer.ids("HELLO THERE"))
    assert out["f:2"] == Bad("f:2", "bad_field", "a shout is text")
    third = out["f:3"]
    assert isinstance(third, Encoded)
    np.testing.assert_array_equal(third.ids, encoder.tokenizer.ids("plain"))


def test_the_commands_build_one_declaration_from_their_flags(tmp_path: Path) -> None:
    """``preprocess`` and ``annotate`` keep their flags; each builds one RecordSource."""
    parser = build_parser()
    args = parser.parse_args(
        ["preprocess", "in.jsonl", "--output", "o", "--loss-on", "last", "--messages-field", "m"]
    )
    assert RecordSource.from_options(vars(args)) == RecordSource(
        text_field="text", messages_field="m", tokenizer="cl100k", loss_on="last"
    )
    args = parser.parse_args(["annotate", "d", "--text-field", "body", "--tokenizer", "cl100k"])
    source = RecordSource.from_options(vars(args))
    assert source == RecordSource(text_field="body", tokenizer="cl100k")
    assert source.named and source.checked() is source
    assert not RecordSource.from_options(vars(parser.parse_args(["annotate", "d"]))).named


def test_a_read_conversation_uses_the_declared_chat_template(tmp_path: Path) -> None:
    """A conversation column read with ``chat_template`` is rendered with that template, as
    ``preprocess`` renders it (before the declaration, readers had no such knob)."""
    tok = build_tokenizer_dir(tmp_path / "tok", LLAMA3)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    record = {"m": json.dumps(messages)}
    plain = RecordSource(messages_field="m", tokenizer=str(tok))
    declared = RecordSource(messages_field="m", tokenizer=str(tok), chat_template=str(template))
    want = registry.encode(Conversation(messages), Encoder(str(tok), chat_template=str(template)))
    got = registry.record_ids(dict(record), declared, "r")
    np.testing.assert_array_equal(got["input_ids"], want.ids)
    np.testing.assert_array_equal(got["loss_spans"], want.spans)
    other = registry.record_ids(dict(record), plain, "r")["input_ids"]
    assert other.tolist() != want.ids.tolist()  # the template is not the directory's own
