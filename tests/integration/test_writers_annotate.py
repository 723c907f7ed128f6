"""``annotate`` on datasets written by stock writers, and ``inspect`` output and exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.cli import main
from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import check_integrity, open_layout
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.records.source import RecordSource

pytestmark = pytest.mark.shared_process

LENGTHS = [int(n) for n in np.random.default_rng(5).integers(1, 300, 90)]


def _stock_mds(out: Path, compression: str | None = None) -> None:
    from streaming import MDSWriter

    columns = {"input_ids": "ndarray:uint32", "n": "int"}
    with MDSWriter(out=str(out), columns=columns, size_limit=2048, compression=compression) as w:
        for i, n in enumerate(LENGTHS):
            w.write({"input_ids": np.full(n, i, np.uint32), "n": n})


def _stock_wds(out: Path) -> None:
    import webdataset as wds

    out.mkdir()
    with wds.ShardWriter(str(out / "part-%04d.tar"), maxcount=20, verbose=0) as w:
        for i, n in enumerate(LENGTHS):
            buf = io.BytesIO()
            np.save(buf, np.full(n, i, np.uint32))
            w.write({"__key__": f"s{i:05d}", "input_ids.npy": buf.getvalue(), "json": {"len": n}})


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_annotate_stock_mds(tmp_path: Path, compression: str | None) -> None:
    out = tmp_path / "mds"
    _stock_mds(out, compression)
    if compression:  # a remote-style copy: only the compressed shards
        for raw in out.glob("*.mds"):
            raw.unlink()
    shards_before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "index.json"}
    index = annotate(out, cost_model="tinygpt", progress=False)
    assert index.tokens.tolist() == LENGTHS
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in shards_before} == (
        shards_before
    )
    meta = json.loads((out / "index.json").read_text())
    assert meta["bcl_index"] == "bcl_index.json"
    assert open_layout(out, check=True).index.content_hash() == index.content_hash()
    by_length = annotate(
        out, length_field="n", cost_model="tinygpt", overwrite=True, progress=False
    )
    assert by_length.content_hash() == index.content_hash()


def test_annotate_stock_wds(tmp_path: Path) -> None:
    out = tmp_path / "wds"
    _stock_wds(out)
    with pytest.raises(DatasetError, match=r"incomplete dataset.*annotate"):
        open_layout(out)
    index = annotate(out, progress=False)
    assert index.tokens.tolist() == LENGTHS
    assert index.shard_counts == [20, 20, 20, 20, 10]
    assert check_integrity(out, index) == []
    with pytest.raises(DatasetError, match=r"already exists.*--overwrite"):
        annotate(out, progress=False)
    by_json = annotate(out, length_field="len", overwrite=True, progress=False)
    assert by_json.tokens.tolist() == LENGTHS


def test_annotate_names_a_missing_field(tmp_path: Path) -> None:
    out = tmp_path / "mds"
    _stock_mds(out)
    with pytest.raises(DatasetError, match=r"no column 'ids'.*--tokens-field"):
        annotate(out, source=RecordSource(tokens_field="ids"), progress=False)
    wds_out = tmp_path / "wds"
    _stock_wds(wds_out)
    with pytest.raises(DatasetError, match=r"no member tokens\.npy"):
        annotate(wds_out, source=RecordSource(tokens_field="tokens"), progress=False)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_inspect_json_and_exit_codes(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / fmt
    (_stock_mds if fmt == "mds" else _stock_wds)(out)
    assert main(["annotate", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    plot = tmp_path / "h.png"
    code = main(["inspect", str(out), "--json", "--max-tokens", "250", "--plot", str(plot)])
    report = json.loads(capsys.readouterr().out)  # exactly one JSON document
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["format"] == fmt
    assert report["records"] == len(LENGTHS)
    assert report["tokens"]["total"] == sum(LENGTHS)
    assert report["tokens"]["max"] == max(LENGTHS)
    assert report["tokens"]["p50"] == float(np.percentile(LENGTHS, 50))
    assert report["cost_model"]["name"] == "llama3-8b"
    assert report["outliers"]["count"] == sum(n > 250 for n in LENGTHS)
    assert plot.stat().st_size > 1000
    # damage: one shard disappears
    victim = sorted(p for p in out.iterdir() if p.suffix in (".mds", ".tar"))[-1]
    victim.unlink()
    assert main(["inspect", str(out), "--json"]) == 1
    broken = json.loads(capsys.readouterr().out)
    assert not broken["ok"] and any(victim.name in p for p in broken["problems"])
    assert main(["inspect", str(out)]) == 1
    assert "integrity: PROBLEMS" in capsys.readouterr().out


def test_inspect_incomplete_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wds"
    _stock_wds(out)
    assert main(["inspect", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "wds" and not report["ok"]
    assert "incomplete dataset" in report["problems"][0]
