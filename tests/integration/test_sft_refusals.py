"""``preprocess`` refusals and pass-through on SFT data, as a user meets them on the CLI.

Refused, each with one line naming ``file:line`` and the fix (exit 2): a tokenizer directory
without a chat template asked to render conversations, content given as parts to a template
that prints them as a Python list, an empty response. Passed through exactly as
``apply_chat_template`` takes them: ``"tools": []`` (Llama-3.1 renders its "Environment:
ipython" block for it), per-record ``chat_template_kwargs`` and ``--chat-template-kwargs``,
``--chat-template FILE``, ShareGPT ``function_call``/``observation`` turns, a UTF-8 BOM.
Templates are the official ones (``tests/official_templates.py``) on a small tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.loader import PackLoader
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.tokenizers import load_hf_tokenizer
from tests.official_templates import (
    FIXTURES,
    PUBLIC_DATA,
    generation_variant,
    records,
    tokenizer_dir,
)

CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And 10?"},
    {"role": "assistant", "content": "100"},
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    out = {f: tokenizer_dir(root / f, f) for f in ("llama3_1", "gemma3", "qwen3")}
    out["none"] = tokenizer_dir(root / "none", "llama3_1", template="")
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]], prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + "".join(json.dumps(r) + "\n" for r in rows).encode())
    return path


def run(*args: str | Path) -> int:
    return main(["preprocess", *map(str, args), "--no-progress"])


def stored(root: Path) -> list[dict[str, Any]]:
    config = ReaderConfig.build(world_size=1, pack_size=1, window=2)
    got = {s["sample_id"]: s for p in PackLoader(MDSPackDataset(root, config, 0)) for s in p}
    return [got[i] for i in sorted(got)]


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_a_tokenizer_without_a_template_is_refused_naming_the_fix(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert not load_hf_tokenizer(str(dirs["none"])).chat_template
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    for extra in ([], ["--skip-bad"]):  # a configuration error: not skipped as a bad record
        assert run(src, "--output", tmp_path / "a", "--tokenizer", dirs["none"], *extra) == 2
        line = error_line(capsys)
        assert f"{src}:1: the tokenizer directory" in line and "has no chat_template" in line
        assert "--chat-template FILE" in line and "--loss-on all" in line
    # the fix: the model's template from a file gives what apply_chat_template gives with it
    template = FIXTURES / "llama3_1.jinja"
    out = tmp_path / "b"
    assert run(src, "--output", out, "--tokenizer", dirs["none"], "--chat-template", template) == 0
    tok = load_hf_tokenizer(str(dirs["none"]))
    want = tok.apply_chat_template(CHAT, tokenize=True, chat_template=template.read_text())
    assert stored(out)[0]["input_ids"].tolist() == list(want)
    assert read_index(out).extra["chat_template"] == template.read_text()
    # text records need no template
    texts = write_jsonl(tmp_path / "text.jsonl", [{"text": "The quick brown fox."}])
    assert (
        run(texts, "--output", tmp_path / "c", "--tokenizer", dirs["none"], "--loss-on", "all") == 0
    )


def test_empty_tools_reach_the_template(tmp_path: Path, dirs: dict[str, Path]) -> None:
    src = write_jsonl(
        tmp_path / "tools.jsonl", [{"messages": CHAT, "tools": []}, {"messages": CHAT}]
    )
    out = tmp_path / "out"
    assert run(src, "--output", out, "--tokenizer", dirs["llama3_1"]) == 0
    tok = load_hf_tokenizer(str(dirs["llama3_1"]))
    with_tools, without = stored(out)
    assert with_tools["input_ids"].tolist() == list(
        tok.apply_chat_template(CHAT, tools=[], tokenize=True)
    )
    assert "Environment: ipython" in tok.decode(with_tools["input_ids"].tolist())
    assert "Environment: ipython" not in tok.decode(without["input_ids"].tolist())


def test_template_kwargs_per_record_and_for_every_record(
    tmp_path: Path, dirs: dict[str, Path]
) -> None:
    own = {"date_string": "01 Jan 2025"}
    src = write_jsonl(
        tmp_path / "kw.jsonl", [{"messages": CHAT, "chat_template_kwargs": own}, {"messages": CHAT}]
    )
    out = tmp_path / "out"
    every = '{"date_string": "02 Feb 2026"}'
    tokenizer = dirs["llama3_1"]
    assert run(src, "--output", out, "--tokenizer", tokenizer, "--chat-template-kwargs", every) == 0
    tok = load_hf_tokenizer(str(tokenizer))
    first, second = stored(out)
    assert first["input_ids"].tolist() == list(tok.apply_chat_template(CHAT, tokenize=True, **own))
    assert second["input_ids"].tolist() == list(
        tok.apply_chat_template(CHAT, tokenize=True, date_string="02 Feb 2026")
    )
    assert "Today Date: 01 Jan 2025" in tok.decode(first["input_ids"].tolist())
    assert "Today Date: 02 Feb 2026" in tok.decode(second["input_ids"].tolist())


def test_qwen3_without_thinking_leaves_the_prompted_think_block_untrained(
    tmp_path: Path, dirs: dict[str, Path]
) -> None:
    """enable_thinking=false puts the empty <think> block into the generation prompt: it is
    not generated, so not trained (as the {% generation %} variant marks it)."""
    kwargs = {"enable_thinking": False}
    src = write_jsonl(tmp_path / "q.jsonl", [{"messages": CHAT, "chat_template_kwargs": kwargs}])
    out = tmp_path / "out"
    assert run(src, "--output", out, "--tokenizer", dirs["qwen3"]) == 0
    tok = load_hf_tokenizer(str(dirs["qwen3"]))
    oracle = tok.apply_chat_template(
        CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
        chat_template=generation_variant("qwen3"), **kwargs,
    )  # fmt: skip
    record = stored(out)[0]
    assert record["input_ids"].tolist() == oracle["input_ids"]
    mask = mask_from_spans(record["loss_spans"], record["input_ids"].size)
    assert mask.astype(int).tolist() == oracle["assistant_masks"]
    trained = tok.decode(record["input_ids"][mask].tolist())
    assert "<think>" not in trained and trained.endswith("100<|im_end|>\n")


def test_content_parts_are_refused_where_the_template_prints_them(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}, CHAT[1]]
    src = write_jsonl(tmp_path / "parts.jsonl", [{"messages": CHAT}, {"messages": parts}])
    # Llama-3.1 trims the content as a string: the list would be trained as its Python repr
    assert run(src, "--output", tmp_path / "a", "--tokenizer", dirs["llama3_1"]) == 2
    line = error_line(capsys)
    assert f"{src}:2:" in line and "messages[0] gives its content as a list of parts" in line
    assert "give the content as a string" in line
    # Gemma-3 iterates parts: accepted, and exactly what apply_chat_template makes of them
    out = tmp_path / "b"
    assert run(src, "--output", out, "--tokenizer", dirs["gemma3"]) == 0
    tok = load_hf_tokenizer(str(dirs["gemma3"]))
    assert stored(out)[1]["input_ids"].tolist() == list(
        tok.apply_chat_template(parts, tokenize=True)
    )


def test_sharegpt_function_call_and_observation_from_a_file_with_a_bom(
    tmp_path: Path, dirs: dict[str, Path]
) -> None:
    rows = records(PUBLIC_DATA / "glaive_toolcall_en_demo.json")
    src = write_jsonl(tmp_path / "glaive.jsonl", rows, prefix=b"\xef\xbb\xbf")
    out = tmp_path / "out"
    assert run(src, "--output", out, "--tokenizer", dirs["qwen3"]) == 0
    tok = load_hf_tokenizer(str(dirs["qwen3"]))
    got = stored(out)
    assert len(got) == len(rows)
    first = rows[0]["conversations"]
    call = json.loads(next(m["value"] for m in first if m["from"] == "function_call"))
    messages = [
        {"role": {"human": "user", "gpt": "assistant", "observation": "tool"}[m["from"]],
         "content": m["value"]}
        if m["from"] != "function_call"
        else {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}
        for m in first
    ]  # fmt: skip
    want = tok.apply_chat_template(messages, tools=json.loads(rows[0]["tools"]), tokenize=True)
    assert got[0]["input_ids"].tolist() == list(want)
    text = tok.decode(got[0]["input_ids"].tolist())
    assert '<tool_call>\n{"name": "search_recipes"' in text and "<tool_response>" in text


def test_an_empty_response_is_refused_or_skipped_and_counted(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"prompt": "Say hi", "response": "hi"}, {"prompt": "Say nothing", "response": ""}]
    src = write_jsonl(tmp_path / "pr.jsonl", rows)
    assert run(src, "--output", tmp_path / "a") == 2
    line = error_line(capsys)
    assert f"{src}:2: the 'response' is empty" in line and "--skip-bad" in line
    assert run(src, "--output", tmp_path / "b", "--skip-bad", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records_written"] == 1
    assert report["skipped_bad"] == {"no_trained_tokens": 1}


def test_a_bom_is_read_past_and_not_part_of_line_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "bom.jsonl", [{"text": "one"}, {"text": "two"}], b"\xef\xbb\xbf")
    out = tmp_path / "out"
    assert run(src, "--output", out) == 0
    assert [r["input_ids"].size for r in stored(out)] == [1, 1]
    # a BOM anywhere else is no byte order mark: line 2 is malformed JSON, named
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "one"}\n\xef\xbb\xbf{"text": "two"}\n')
    assert run(bad, "--output", tmp_path / "x") == 2
    assert f"{bad}:2: malformed JSON" in error_line(capsys)


def test_parts_with_other_template_kwargs_are_not_merged(
    tmp_path: Path, dirs: dict[str, Path]
) -> None:
    from bcl_stream.errors import DatasetError
    from bcl_stream.preprocess import preprocess
    from bcl_stream.preprocess.merge import merge

    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}] * 8)
    out, tok = tmp_path / "out", str(dirs["llama3_1"])
    given = {"date_string": "01 Jan 2025"}
    preprocess([str(src)], str(out), source=RecordSource(tokenizer=tok), part="0/2", progress=False)
    preprocess([str(src)], str(out), source=RecordSource(tokenizer=tok, chat_template_kwargs=given), part="1/2", progress=False)  # fmt: skip
    with pytest.raises(DatasetError, match=r"part-1-of-2: its chat_template_kwargs is \{'date"):
        merge(out)
    assert read_index(out / "part-1-of-2").extra["preprocess"]["chat_template_kwargs"] == given
