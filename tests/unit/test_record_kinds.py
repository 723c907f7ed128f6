"""The record-kind seam (``bcl_stream/records/``): every kind implements the protocol, the
registry's detection order is the documented one, and a kind added to the registry is read
and encoded by ``preprocess``'s worker path without touching it (docs/extending.md)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pytest

from bcl_stream.preprocess.work import EncodeOptions, tokenize_stream
from bcl_stream.records import registry
from bcl_stream.records.kind import Bad, Encoders, Ids, LayoutOptions
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import Encoded, Encoder

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

    def declared(
        self,
        fields: tuple[str, ...],
        columns: dict[str, str],
        tokenizer: str | None,
        loss_on: str | None,
        where: str,
    ) -> RecordSource:
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
    out = dict(tokenize_stream(iter(raws), EncodeOptions("cl100k"), workers=1))
    encoder = Encoder("cl100k")
    first = out["f:1"]
    assert isinstance(first, Encoded) and first.spans is None
    np.testing.assert_array_equal(first.ids, encoder.tokenizer.ids("HELLO THERE"))
    assert out["f:2"] == Bad("f:2", "bad_field", "a shout is text")
    third = out["f:3"]
    assert isinstance(third, Encoded)
    np.testing.assert_array_equal(third.ids, encoder.tokenizer.ids("plain"))
