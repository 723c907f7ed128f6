"""Partitioned preprocess + merge, end to end with the real cl100k tokenizer: the merged
dataset of N parts equals a single run record for record (ids, sources, tokens, costs,
hashes) through stock ``StreamingDataset`` and stock ``webdataset``, local and on ``s3://``
(moto on 127.0.0.1); a part killed mid-write and re-run loses and duplicates nothing; merges
of missing, duplicated, mixed or unlike parts are refused naming the part."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import ROOT, bcl_stream_cli
from pack_oracles import check_every_record_once
from parts_corpus import OPTIONS, assert_same, write_corpus

from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import open_file_layout
from bcl_stream.io.index import read_index
from bcl_stream.io.remote import open_cost_index
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.merge import merge

pytestmark = pytest.mark.slow

PARTS = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def single(corpus: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One whole run per format: what every merge must equal."""
    root = tmp_path_factory.mktemp("single")
    for fmt, options in OPTIONS.items():
        preprocess(corpus, str(root / fmt), progress=False, workers=1, **options)
    return {fmt: root / fmt for fmt in OPTIONS}


def _write_parts(corpus: list[str], out: str, fmt: str, **extra: Any) -> None:
    options = {**OPTIONS[fmt], **extra}
    for i in range(PARTS):
        preprocess(corpus, out, progress=False, workers=1, part=f"{i}/{PARTS}", **options)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_merged_parts_equal_a_single_run(
    corpus: list[str], single: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / "out"
    _write_parts(corpus, str(out), fmt)
    index = merge(out)
    assert [p["name"] for p in index.extra["merge"]["parts"]] == [
        f"part-{i}-of-3" for i in range(3)
    ]
    assert all(s.name.startswith("part-") for s in index.shards)
    open_file_layout(out, check=True)  # our integrity check: shard list, counts, record hashes
    assert_same(out, single[fmt], fmt, tmp_path)
    if fmt == "wds":
        _wds_plan_reads(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    result = bcl_stream_cli("merge", str(out))  # idempotent: a re-run writes the same bytes
    assert result.returncode == 0, result.stderr
    assert "merged 3 parts" in result.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def _wds_plan_reads(root: Path) -> None:
    """Our reader and the ``bcl_packs`` stage after stock webdataset both follow the plan over
    a merged WebDataset, whose keys (``part-I-of-N-<id>``) map to global record ids."""
    import webdataset as wds

    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.wds_reader import WDSPackDataset, bcl_packs, key_sample_id

    config = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=3)
    dataset = WDSPackDataset(root, config, 1)
    want = dataset.epoch_plan(0).rank_packs(1).tolist()
    assert [[int(s["sample_id"]) for s in pack] for pack in dataset] == want
    urls = [str(root / shard.name) for shard in dataset.index.shards]
    stage = wds.pipelinefilter(bcl_packs)(index=dataset.index, config=config, rank=1)
    pipe = wds.DataPipeline(
        wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode(), stage
    )
    firsts = [p["first"] for p in dataset.index.extra["merge"]["parts"]]
    got = [[key_sample_id(s["__key__"], firsts) for s in pack] for pack in pipe]
    assert got == want
    keys = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False)]
    check_every_record_once(keys, what="a key repeated across parts")
    assert len(keys) == len(dataset.index)


KILL = """
import os, signal, sys
from bcl_stream.formats.mds_costing import CostedMDS  # both MDS writers write through it
from bcl_stream.preprocess import preprocess

real, written = CostedMDS.write, []
def write(self, sample, tokens=None):
    real(self, sample, tokens)
    written.append(1)
    if len(written) == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
CostedMDS.write = write
preprocess(sys.argv[4:], sys.argv[1], part=sys.argv[2], workers=1, progress=False,
           shard_size_limit=8192)
"""


def test_part_killed_mid_write_then_rerun_merges_to_the_single_run(
    corpus: list[str], single: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run(
        [sys.executable, "-c", KILL, str(out), f"1/{PARTS}", "60", *corpus],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    part = out / "part-1-of-3"
    assert any(p.name.endswith(".mds") for p in part.iterdir())  # shards were written ...
    assert not (part / "index.json").exists()  # ... but never completed
    for i in (0, 2):
        preprocess(
            corpus, str(out), progress=False, workers=1, part=f"{i}/{PARTS}", **OPTIONS["mds"]
        )
    with pytest.raises(DatasetError, match=r"part-1-of-3.*incomplete.*--part 1/3"):
        merge(out)
    result = bcl_stream_cli(
        "preprocess",
        *corpus,
        "--output",
        str(out),
        "--part",
        "1/3",
        "--workers",
        "1",
        "--shard-size-limit",
        "8192",
        "--no-progress",
    )  # fmt: skip  (no --overwrite: an incomplete part is replaced)
    assert result.returncode == 0, result.stderr
    merge(out)
    assert_same(out, single["mds"], "mds", tmp_path)


def test_merges_of_wrong_parts_are_refused_naming_the_part(
    corpus: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _write_parts(corpus, str(out), "mds")
    # a complete part is not rewritten without --overwrite
    with pytest.raises(DatasetError, match="already exists"):
        preprocess(corpus, str(out), progress=False, workers=1, part="0/3", **OPTIONS["mds"])
    moved = tmp_path / "moved"
    shutil.move(out / "part-2-of-3", moved)
    with pytest.raises(DatasetError, match=r"part-2-of-3\).*--part 2/3"):
        merge(out)
    shutil.copytree(out / "part-1-of-3", out / "part-2-of-3")  # a part copied under another name
    with pytest.raises(DatasetError, match=r"part-2-of-3: it holds part 1/3.*duplicated"):
        merge(out)
    shutil.rmtree(out / "part-2-of-3")
    shutil.move(moved, out / "part-2-of-3")
    preprocess(corpus, str(out), progress=False, workers=1, part="0/2", **OPTIONS["mds"])
    with pytest.raises(DatasetError, match="different splits"):
        merge(out)
    shutil.rmtree(out / "part-0-of-2")
    preprocess(
        corpus, str(out), progress=False, workers=1, part="1/3", overwrite=True,
        cost_model="tokens", **OPTIONS["mds"],
    )  # fmt: skip
    with pytest.raises(DatasetError, match=r"part-1-of-3: its cost model is 'tokens'"):
        merge(out)
    preprocess(
        corpus[:2], str(out), progress=False, workers=1, part="1/3", overwrite=True,
        **OPTIONS["mds"],
    )  # fmt: skip
    with pytest.raises(DatasetError, match=r"part-1-of-3: its inputs"):
        merge(out)
    preprocess(
        corpus, str(out), progress=False, workers=1, part="1/3", overwrite=True, format="wds"
    )
    with pytest.raises(DatasetError, match=r"part-1-of-3: its format is 'wds'"):
        merge(out)
    assert not (out / "index.json").exists() and not (out / "bcl_index.json").exists()


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_parts_on_s3_merge_to_the_single_run(
    capsys: pytest.CaptureFixture[str],
    moto_s3: Callable[[str], str],
    corpus: list[str],
    single: dict[str, Path],
    tmp_path: Path,
    fmt: str,
) -> None:
    remote = moto_s3(f"bcl-parts-{fmt}") + "/ds"
    # fewer, larger shards than the local tests: each upload costs a client here (~0.3 s)
    _write_parts(
        corpus, remote, fmt, **{"mds": {"shard_size_limit": 1 << 16}, "wds": {"maxcount": 200}}[fmt]
    )
    index = merge(remote)
    assert len(index) == len(read_index(single[fmt]))
    assert index.extra["preprocess"]["output"] == remote
    local = tmp_path / "index"
    index_again, _ = open_cost_index(remote, local)
    assert index_again.content_hash() == index.content_hash()
    merge(remote)  # idempotent on S3 too
    assert open_cost_index(remote, tmp_path / "again")[0].content_hash() == index.content_hash()
    assert_same(local, single[fmt], fmt, tmp_path, remote)
    from bcl_stream.cli import main

    assert main(["inspect", remote, "--json"]) == 0  # every shard found under its part
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["records"] == len(index), report["problems"]
