"""``annotate`` of SFT datasets other tools wrote: llm-foundry's prompt/response MDS (stock
``MDSWriter``, text or pre-tokenized), prompt/response WebDataset, and stored ``loss_spans``.
The readers then yield prompt + response ids with the response as the loss mask, and the cost
index's trained counts are exactly the masks' counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pack_oracles import check_every_record_once

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.collate import collate_packed
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.records.prompt_response import PromptResponse, encode_prompt_response
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import trained_count
from bcl_stream.text.templates import Encoder
from bcl_stream.text.tokenizers import load_hf_tokenizer
from tests.hf_tokenizers import LLAMA3, build_tokenizer_dir

PAIRS = [
    (f"Question {i}: what is {i} + {i}?" + " why" * (i % 5), f"It is {2 * i}." + " yes" * (i % 7))
    for i in range(30)
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tokenizer_dir(tmp_path_factory.mktemp("tok") / "llama", LLAMA3))


def read_all(root: Path, fmt: str = "mds") -> dict[int, dict]:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=3)
    samples = [s for pack in PackLoader(reader(root, config, 0)) for s in pack]
    check_every_record_once([s["sample_id"] for s in samples], len(read_index(root)))
    return {s["sample_id"]: s for s in samples}


@pytest.mark.parametrize(
    "named",
    [["--text-field", "prompt", "--response-field", "response"], []],
    ids=["named", "found"],
)
def test_llm_foundry_text_prompt_response_mds(
    tmp_path: Path, tok_dir: str, named: list[str]
) -> None:
    """Named with flags, or found by its column names as preprocess finds a record's layout
    (no field flag, only the tokenizer): the same index and the same reads."""
    from streaming import MDSWriter

    with MDSWriter(
        out=str(tmp_path), columns={"prompt": "str", "response": "str"}, size_limit=2048
    ) as w:
        for prompt, response in PAIRS:
            w.write({"prompt": prompt, "response": response})
    args = ["annotate", str(tmp_path), *named, "--tokenizer", tok_dir]
    assert main([*args, "--cost-model", "tokens", "--no-progress"]) == 0
    index = read_index(tmp_path)
    assert index.extra["annotate"] == {
        "text_field": "prompt",
        "response_field": "response",
        "tokenizer": tok_dir,
        "tokenizer_id": index.extra["annotate"]["tokenizer_id"],
    }
    encoder = Encoder(tok_dir)
    want = [encode_prompt_response(PromptResponse(p, r), encoder) for p, r in PAIRS]
    assert index.tokens.tolist() == [e.ids.size for e in want]
    assert index.trained.tolist() == [e.trained for e in want]
    got = read_all(tmp_path)
    for sid, sample in got.items():
        assert sample["input_ids"].tolist() == want[sid].ids.tolist()
        assert sample["loss_spans"].tolist() == want[sid].spans.tolist()
        start, end = sample["loss_spans"].tolist()
        tail = [*encoder.tokenizer.ids(PAIRS[sid][1]).tolist(), encoder.tokenizer.eos_id]
        assert sample["input_ids"][start:end].tolist() == tail  # the response and its EOS only
    # what the trainer gets: Hugging Face labels hold the response and its EOS, -100 elsewhere
    pack = [got[sid] for sid in sorted(got)[:4]]
    labels = collate_packed(pack, labels="unshifted")["labels"][0].tolist()
    offset = 0
    for sample in pack:
        start, end = sample["loss_spans"].tolist()
        n = sample["input_ids"].size
        own = labels[offset : offset + n]
        assert own[start:end] == sample["input_ids"][start:end].tolist()
        assert set(own[:start]) == {-100} and set(own[end:]) <= {-100}
        offset += n


def test_llm_foundry_pretokenized_prompt_response_mds(tmp_path: Path) -> None:
    from streaming import MDSWriter

    rng = np.random.default_rng(0)
    rows = [
        (
            rng.integers(0, 500, rng.integers(1, 40)).astype(np.uint32),
            rng.integers(0, 500, rng.integers(1, 30)).astype(
                np.uint32
            ),  # MDS stores no empty array
        )
        for _ in range(40)
    ]
    columns = {"input_ids": "ndarray:uint32", "labels": "ndarray:uint32"}
    with MDSWriter(out=str(tmp_path), columns=columns, size_limit=1024) as w:
        for prompt, response in rows:
            w.write({"input_ids": prompt, "labels": response})
    index = annotate(
        tmp_path, source=RecordSource(response_field="labels"), cost_model="tokens", progress=False
    )
    assert index.tokens.tolist() == [p.size + r.size for p, r in rows]
    # the same ids under preprocess's names are found without a flag
    named = tmp_path / "named"
    columns = {"prompt": "ndarray:uint32", "response": "ndarray:uint32"}
    with MDSWriter(out=str(named), columns=columns, size_limit=1024) as w:
        for prompt, response in rows:
            w.write({"prompt": prompt, "response": response})
    found = annotate(named, cost_model="tokens", progress=False)
    assert found.extra["annotate"] == {"tokens_field": "prompt", "response_field": "response"}
    assert found.tokens.tolist() == index.tokens.tolist()
    assert found.trained.tolist() == index.trained.tolist()
    assert index.trained.tolist() == [
        trained_count([p.size, p.size + r.size], p.size + r.size) if r.size else 0 for p, r in rows
    ]
    assert index.extra["annotate"]["response_field"] == "labels"
    for sid, sample in read_all(tmp_path).items():
        prompt, response = rows[sid]
        assert sample["input_ids"].tolist() == [*prompt.tolist(), *response.tolist()]
        spans = [prompt.size, prompt.size + response.size] if response.size else []
        assert sample["loss_spans"].tolist() == spans


@pytest.mark.parametrize("named", [True, False], ids=["named", "found"])
def test_prompt_response_webdataset(tmp_path: Path, tok_dir: str, named: bool) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=8, verbose=0) as sink:
        for i, (prompt, response) in enumerate(PAIRS):
            sink.write({"__key__": f"{i:06d}", "json": {"prompt": prompt, "completion": response}})
    fields = {"text_field": "prompt", "response_field": "completion"} if named else {}
    index = annotate(
        tmp_path,
        source=RecordSource(**fields, tokenizer=tok_dir),
        cost_model="tokens",
        progress=False,
    )
    assert index.extra["annotate"]["response_field"] == "completion"
    encoder = Encoder(tok_dir)
    want = [encode_prompt_response(PromptResponse(p, r), encoder) for p, r in PAIRS]
    assert index.trained.tolist() == [e.trained for e in want]
    for sid, sample in read_all(tmp_path, "wds").items():
        assert sample["input_ids"].tolist() == want[sid].ids.tolist()
        assert sample["loss_spans"].tolist() == want[sid].spans.tolist()


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_stored_masks_are_counted(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(25):
        n = int(rng.integers(2, 30))
        a = int(rng.integers(0, n - 1))
        rows.append((np.arange(n, dtype=np.uint32), np.asarray([a, n], dtype=np.uint32)))
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(
            out=str(tmp_path),
            columns={"input_ids": "ndarray:uint32", "loss_spans": "ndarray:uint32"},
            size_limit=1024,
        ) as w:
            for ids, spans in rows:
                w.write({"input_ids": ids, "loss_spans": spans})
    else:
        import webdataset as wds

        with wds.ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=10, verbose=0) as sink:
            for i, (ids, spans) in enumerate(rows):
                sink.write({"__key__": f"{i:06d}", "input_ids.npy": ids, "loss_spans.npy": spans})
    index = annotate(tmp_path, cost_model="tokens", progress=False)
    assert index.trained.tolist() == [trained_count(s, ids.size) for ids, s in rows]
    for sid, sample in read_all(tmp_path, fmt).items():
        assert sample["loss_spans"].tolist() == rows[sid][1].tolist()


def test_a_stored_mask_that_breaks_the_form_is_named(tmp_path: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(
        out=str(tmp_path), columns={"input_ids": "ndarray:uint32", "loss_spans": "ndarray:uint32"}
    ) as w:
        w.write(
            {
                "input_ids": np.arange(5, dtype=np.uint32),
                "loss_spans": np.asarray([1, 3], np.uint32),
            }
        )
        w.write(
            {
                "input_ids": np.arange(5, dtype=np.uint32),
                "loss_spans": np.asarray([4, 2], np.uint32),
            }
        )
    with pytest.raises(
        DatasetError, match=r"shard\.00000\.mds sample 1: loss_spans interval 0 \[4, 2\) is empty"
    ):
        annotate(tmp_path, cost_model="tokens", progress=False)


def test_what_cannot_be_found_by_name_is_refused_naming_the_fix(tmp_path: Path) -> None:
    from streaming import MDSWriter

    text = tmp_path / "text"
    with MDSWriter(out=str(text), columns={"prompt": "str", "response": "str"}) as w:
        w.write({"prompt": "a", "response": "b"})
    with pytest.raises(
        DatasetError,
        match=r"holds prompt/response columns \(llm-foundry's finetuning layout\) 'prompt', "
        r"'response'; pass --tokenizer",
    ):
        annotate(text, progress=False)
    other = tmp_path / "other"
    with MDSWriter(out=str(other), columns={"question": "str", "answer": "str"}) as w:
        w.write({"question": "a", "answer": "b"})
    with pytest.raises(
        DatasetError, match=r"no layout preprocess recognises.*\['answer', 'question'\]"
    ):
        annotate(other, source=RecordSource(tokenizer="cl100k"), progress=False)
    ids = tmp_path / "ids"
    with MDSWriter(out=str(ids), columns={"input_ids": "ndarray:uint32"}) as w:
        w.write({"input_ids": np.arange(3, dtype=np.uint32)})
    with pytest.raises(DatasetError, match=r"token ids in column 'input_ids'.*drop them"):
        annotate(ids, source=RecordSource(tokenizer="cl100k"), progress=False)
    for root in (text, other, ids):  # nothing written
        assert json.loads((root / "index.json").read_text()).get("bcl_index") is None


def test_a_missing_response_column_is_named(tmp_path: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path), columns={"prompt": "str", "answer": "str"}) as w:
        w.write({"prompt": "a", "answer": "b"})
    with pytest.raises(
        DatasetError,
        match=r"no column 'response' for the prompt text column 'prompt' \+ response column 'response'",
    ):
        annotate(
            tmp_path,
            source=RecordSource(text_field="prompt", response_field="response", tokenizer="cl100k"),
            progress=False,
        )
    assert json.loads((tmp_path / "index.json").read_text()).get("bcl_index") is None


CONVERSATIONS = [
    [
        {"role": "user", "content": f"question {i} " + "why " * (i % 6)},
        {"role": "assistant", "content": "because\n\n" * (i % 4 + 1)},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": f"{i}"},
    ]
    for i in range(20)
]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
@pytest.mark.parametrize("loss_on", ["assistant", "last"])
def test_stored_conversations_are_rendered_as_preprocess_renders_them(
    tmp_path: Path, fmt: str, loss_on: str
) -> None:
    from tests.hf_tokenizers import LLAMA3_GENERATION

    tok = str(build_tokenizer_dir(tmp_path / "tok", LLAMA3_GENERATION))
    data = tmp_path / "data"
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(out=str(data), columns={"messages": "json"}, size_limit=2048) as w:
            for messages in CONVERSATIONS:
                w.write({"messages": messages})
    else:
        import webdataset as wds

        data.mkdir()
        with wds.ShardWriter(str(data / "shard-%06d.tar"), maxcount=7, verbose=0) as sink:
            for i, messages in enumerate(CONVERSATIONS):
                sink.write({"__key__": f"{i:06d}", "json": {"messages": messages}})
    # the conversation column is found by its name, as preprocess finds it in a record
    index = annotate(
        data,
        source=RecordSource(tokenizer=tok, loss_on=loss_on),
        cost_model="tokens",
        progress=False,
    )
    assert index.extra["annotate"]["messages_field"] == "messages"
    encoder = Encoder(tok, loss_on)
    from bcl_stream.records.registry import encode
    from bcl_stream.text.chat import Conversation

    want = [encode(Conversation(m), encoder) for m in CONVERSATIONS]
    assert index.tokens.tolist() == [e.ids.size for e in want]
    assert index.trained.tolist() == [e.trained for e in want]
    oracle = load_hf_tokenizer(tok)
    for sid, sample in read_all(data, fmt).items():
        assert sample["input_ids"].tolist() == list(
            oracle.apply_chat_template(CONVERSATIONS[sid], tokenize=True)
        )
        assert sample["loss_spans"].tolist() == want[sid].spans.tolist()


def test_a_stored_conversation_with_nothing_to_train_is_named(tmp_path: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path), columns={"messages": "json"}) as w:
        w.write({"messages": CONVERSATIONS[0]})
        w.write({"messages": [{"role": "user", "content": "no answer"}]})
    with pytest.raises(
        DatasetError,
        match=r"shard\.00000\.mds sample 1: the conversation has no assistant turn.*cannot be left out",
    ):
        annotate(
            tmp_path,
            source=RecordSource(messages_field="messages", tokenizer="cl100k"),
            progress=False,
        )
    index = annotate(
        tmp_path,
        source=RecordSource(messages_field="messages", tokenizer="cl100k", loss_on="all"),
        progress=False,
    )
    assert index.trained.tolist() == (index.tokens - 1).tolist()


def test_a_chat_template_file_renders_stored_conversations_as_preprocess_does(
    tmp_path: Path,
) -> None:
    """``annotate --chat-template FILE``: a tokenizer directory without a template annotates a
    conversation column with the given one, exactly as ``preprocess --chat-template`` writes
    it, and the readers re-render with it; the same template for a text column is refused."""
    from streaming import MDSWriter

    from bcl_stream.records.registry import encode
    from bcl_stream.text.chat import Conversation
    from tests.hf_tokenizers import LLAMA3_GENERATION

    tok = str(build_tokenizer_dir(tmp_path / "tok", None))
    template = tmp_path / "template.jinja"
    template.write_text(LLAMA3_GENERATION)
    data = tmp_path / "data"
    with MDSWriter(out=str(data), columns={"messages": "json"}, size_limit=2048) as w:
        for messages in CONVERSATIONS:
            w.write({"messages": messages})
    args = ["annotate", str(data), "--tokenizer", tok, "--cost-model", "tokens", "--no-progress"]
    assert main(args) == 2  # no template in the directory: refused naming --chat-template
    assert main([*args, "--chat-template", str(template)]) == 0
    encoder = Encoder(tok, "assistant", chat_template=str(template))
    want = [encode(Conversation(m), encoder) for m in CONVERSATIONS]
    index = read_index(data)
    assert index.tokens.tolist() == [e.ids.size for e in want]
    assert index.trained.tolist() == [e.trained for e in want]
    for sid, sample in read_all(data, "mds").items():
        assert sample["input_ids"].tolist() == want[sid].ids.tolist()
        assert sample["loss_spans"].tolist() == want[sid].spans.tolist()
    text = tmp_path / "text"
    with MDSWriter(out=str(text), columns={"text": "str"}) as w:
        w.write({"text": "plain words"})
    text_args = ["annotate", str(text), "--tokenizer", tok, "--chat-template", str(template)]
    assert main([*text_args, "--no-progress"]) == 2
