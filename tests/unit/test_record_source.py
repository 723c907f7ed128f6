"""Where token ids come from (``records/source.py``, ``formats/token_ids.py``): one set of
rules for annotate's counts and the readers' ids; recorded in the reader cursor."""

from __future__ import annotations

import numpy as np
import pytest

from bcl_stream.epoch.cursor import STATE_VERSION, Cursor, parse_state
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError, StateError
from bcl_stream.formats.token_ids import length_value, token_count, token_ids
from bcl_stream.records.source import RecordSource

RAW = RecordSource(tokens_field="tokens", tokens_dtype="int64")
TEXT = RecordSource(text_field="text", tokenizer="cl100k")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"text_field": "text"}, "go together"),
        ({"tokenizer": "cl100k"}, "go together"),
        ({"text_field": "t", "tokenizer": "cl100k", "tokens_dtype": "int64"}, "not both"),
        ({"tokens_dtype": "float32"}, "integer dtype"),
        ({"tokens_dtype": "nonsense"}, "not a dtype"),
        ({"tokens_field": ""}, "non-empty"),
        ({"response_field": "input_ids"}, "is the prompt column too"),
        ({"messages_field": "messages"}, "messages_field takes a tokenizer"),
        (
            {"messages_field": "m", "tokenizer": "cl100k", "response_field": "r"},
            "and no other column",
        ),
        ({"messages_field": "m", "tokenizer": "cl100k", "loss_on": "some"}, "loss_on must be"),
        ({"loss_on": "last"}, "loss_on goes with messages_field"),
    ],
)
def test_a_source_refuses_what_cannot_be_read(kwargs: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=says):
        RecordSource(**kwargs)


def test_ids_and_counts_agree_and_refuse_what_is_not_ids() -> None:
    ids = np.arange(7, dtype=np.int64)
    assert token_ids(ids.tobytes(), RAW, "r").tolist() == ids.tolist()
    assert token_count(ids.tobytes(), RAW, "r") == 7
    assert token_count(np.arange(5, dtype=np.uint32), RecordSource(), "r") == 5
    text = "hello world, " * 20
    assert token_count(text, TEXT, "r") == token_ids(text.encode(), TEXT, "r").size > 10
    for value, source, says in [
        (ids.tobytes(), RecordSource(tokens_field="tokens"), "declare the integer type"),
        (ids.tobytes()[:-1], RAW, "not a whole number"),
        ("some text " * 500, RecordSource(), "holds text"),
        (np.ones(3, np.float32), RecordSource(), "not a 1-D array of integer"),
        (np.int64(5), RecordSource(), "--length-field"),
        (ids, TEXT, "not text"),
    ]:
        with pytest.raises(DatasetError, match=says) as info:
            token_count(value, source, "rec 3")
        assert len(str(info.value)) < 400  # a quoted value is cut
    assert length_value(b" 12\n", "n", "r") == 12
    with pytest.raises(DatasetError, match="not an integer"):
        length_value("a long text " * 1000, "n", "r")


def test_the_cursor_records_the_source_and_refuses_version_3() -> None:
    plain = ReaderConfig.build(world_size=2, pack_size=4, window=4)
    assert "tokens" not in plain.to_dict()  # the stored input_ids: the layout of before
    assert ReaderConfig.build(world_size=2, pack_size=4, window=4, tokens=RecordSource()) == plain
    raw = ReaderConfig.build(world_size=2, pack_size=4, window=4, tokens=RAW)
    assert raw.to_dict()["tokens"] == {"tokens_field": "tokens", "tokens_dtype": "int64"}
    assert ReaderConfig.from_dict(raw.to_dict()) == raw
    state = Cursor(0, 3, "f" * 16, raw).to_dict()
    assert state["version"] == STATE_VERSION
    assert parse_state(state).config.tokens == RAW
    old = {**Cursor(0, 3, "f" * 16, plain).to_dict(), "version": 3}
    with pytest.raises(StateError, match="version 3 was written by planner v2"):
        parse_state(old)  # planner v3 orders every epoch differently: it cannot be replayed


def test_a_resume_with_another_source_is_refused() -> None:
    from bcl_stream.epoch.cursor import resolve_state
    from bcl_stream.errors import StateError

    raw = ReaderConfig.build(world_size=2, pack_size=4, window=4, tokens=RAW)
    text = ReaderConfig.build(world_size=2, pack_size=4, window=4, tokens=TEXT)
    state = Cursor(0, 3, "f" * 16, raw).to_dict()
    assert resolve_state(state, fingerprint="f" * 16, config=raw).packs_consumed == 3
    with pytest.raises(StateError, match="saved with tokens="):
        resolve_state(state, fingerprint="f" * 16, config=text)


def test_sft_sources_describe_what_they_read_and_round_trip() -> None:
    pr = RecordSource(text_field="prompt", tokenizer="cl100k", response_field="response")
    assert pr.fields == ("prompt", "response")
    assert pr.describe() == (
        "prompt text column 'prompt' + response column 'response' tokenized with cl100k"
    )
    chat = RecordSource(messages_field="conversations", tokenizer="cl100k", loss_on="last")
    assert chat.field == "conversations" and chat.is_conversation and not chat.is_text
    assert "rendered with cl100k (loss on last)" in chat.describe()
    for source in (pr, chat):
        assert RecordSource.from_dict(source.to_dict()) == source
