"""Writing to ``s3://`` (moto on 127.0.0.1): upload order, stock readers, existing outputs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.formats import mds_costing, wds_writer
from bcl_stream.formats.mds_writer import CostedMDSWriter
from bcl_stream.io.remote import download, open_cost_index
from bcl_stream.preprocess import preprocess

pytestmark = pytest.mark.slow


def _keys(remote: str) -> set[str]:
    import boto3

    url = urlparse(remote)
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    listing = client.list_objects_v2(Bucket=url.netloc, Prefix=url.path.lstrip("/") + "/")
    prefix = url.path.lstrip("/") + "/"
    return {o["Key"][len(prefix) :] for o in listing.get("Contents", [])}


def _corpus(path: Path, n: int = 80) -> str:
    with open(path, "w") as fh:
        for i in range(n):
            msgs = [
                {"role": "user", "content": f"q{i} " * (i % 9 + 1)},
                {"role": "assistant", "content": "answer " * (i % 31 + 1)},
            ]
            fh.write(json.dumps({"messages": msgs, "source": "t"}) + "\n")
    return str(path)


def _record_uploads(
    monkeypatch: pytest.MonkeyPatch, module: object, marker: str
) -> list[tuple[str, set[str]]]:
    """Wrap ``upload`` in the writer module (``mds_costing`` for MDS: the ending both MDS
    writers share) and in ``bcl_stream.io.remote`` (whose ``upload_index`` uploads the cost
    index for both writers): note each name and what the
    bucket held when the marker went up; the list they are noted in is returned."""
    from bcl_stream.io import remote

    seen: list[tuple[str, set[str]]] = []
    for target in (module, remote):
        real: Callable[..., None] = target.upload  # type: ignore[attr-defined]

        def spy(
            local: str, remote_dir: str, name: str, real: Callable[..., None] = real, **kw: object
        ) -> None:
            seen.append((name, _keys(remote_dir) if name == marker else set()))
            real(local, remote_dir, name, **kw)

        monkeypatch.setattr(target, "upload", spy)
    return seen


def test_mds_to_s3_uploads_costs_before_index_json(
    moto_s3: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = moto_s3("bcl-w-mds") + "/ds"
    seen = _record_uploads(monkeypatch, mds_costing, "index.json")
    report = preprocess(
        [_corpus(tmp_path / "c.jsonl")], remote, progress=False, shard_size_limit=2048
    )
    assert [name for name, _ in seen] == ["bcl_costs.npy", "bcl_index.json", "index.json"]
    before_index = seen[-1][1]
    shards = {k for k in _keys(remote) if k.endswith(".mds")}
    assert len(shards) == report.shards > 1
    assert shards | {"bcl_costs.npy", "bcl_index.json"} <= before_index
    assert "index.json" not in before_index

    from streaming import StreamingDataset

    ds = StreamingDataset(remote=remote, local=str(tmp_path / "cache"), batch_size=1, shuffle=False)
    index, _ = open_cost_index(remote, tmp_path / "idx")
    assert len(ds) == len(index) == 80
    assert [len(ds[i]["input_ids"]) for i in range(80)] == index.tokens.tolist()


def test_wds_to_s3_uploads_index_last(
    moto_s3: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import webdataset as wds

    remote = moto_s3("bcl-w-wds") + "/ds"
    seen = _record_uploads(monkeypatch, wds_writer, "bcl_index.json")
    preprocess([_corpus(tmp_path / "c.jsonl")], remote, format="wds", maxcount=30, progress=False)
    names = [name for name, _ in seen]
    shards = ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert names == [*shards, "bcl_costs.npy", "bcl_hashes.npy", "bcl_index.json"]
    assert {"shard-000002.tar", "bcl_costs.npy", "bcl_hashes.npy"} <= seen[-1][1]
    index, _ = open_cost_index(remote, tmp_path / "idx")
    local = [download(f"{remote}/{s.name}", tmp_path / "dl" / s.name) for s in index.shards]
    samples = list(wds.WebDataset([str(p) for p in local], shardshuffle=False).decode())
    assert [len(s["input_ids.npy"]) for s in samples] == index.tokens.tolist()


def test_existing_s3_output_is_refused_unless_overwrite(
    moto_s3: Callable[[str], str], tmp_path: Path
) -> None:
    remote = moto_s3("bcl-w-again") + "/ds"
    src = _corpus(tmp_path / "c.jsonl", 20)
    preprocess([src], remote, progress=False)
    with pytest.raises(DatasetError, match=r"already exists.*--overwrite"):
        preprocess([src], remote, progress=False)
    preprocess([src], remote, format="wds", overwrite=True, progress=False)
    keys = _keys(remote)
    assert "index.json" not in keys  # the old MDS completion marker is gone
    assert open_cost_index(remote, tmp_path / "idx")[0].format == "wds"


def test_interrupted_s3_write_leaves_no_index(
    moto_s3: Callable[[str], str], tmp_path: Path
) -> None:
    remote = moto_s3("bcl-w-int") + "/ds"
    with (
        pytest.raises(RuntimeError, match="stop"),
        CostedMDSWriter(remote, cost_model="tokens", size_limit=256) as writer,
    ):
        for i in range(50):
            writer.write({"input_ids": np.arange(i % 13 + 1, dtype=np.uint32)})
        raise RuntimeError("stop")
    keys = _keys(remote)
    assert not keys & {"index.json", "bcl_index.json", "bcl_costs.npy"}


def test_annotate_and_inspect_remote(
    moto_s3: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streaming import MDSWriter

    from bcl_stream.cli import main

    remote = moto_s3("bcl-w-annot") + "/ds"
    lengths = [i % 17 + 1 for i in range(60)]
    with MDSWriter(out=remote, columns={"input_ids": "ndarray:uint32"}, size_limit=1024) as w:
        for n in lengths:
            w.write({"input_ids": np.zeros(n, np.uint32)})
    assert main(["inspect", remote, "--json"]) == 1
    assert "annotate" in json.loads(capsys.readouterr().out)["problems"][0]
    assert main(["annotate", remote, "--no-progress", "--cost-model", "tokens"]) == 0
    capsys.readouterr()
    assert {"bcl_costs.npy", "bcl_index.json", "index.json"} <= _keys(remote)
    assert open_cost_index(remote, tmp_path / "idx")[0].tokens.tolist() == lengths
    assert main(["inspect", remote, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["location"] == remote and report["records"] == 60


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_skipped_records_are_listed_beside_remote_shards(
    moto_s3: Callable[[str], str], tmp_path: Path, fmt: str
) -> None:
    src = tmp_path / "chat.jsonl"
    _corpus(src, 20)
    with open(src, "a") as fh:  # two conversations with nothing to train, lines 21 and 22
        for _ in range(2):
            fh.write(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    remote = moto_s3(f"skip-{fmt}") + "/sft"
    report = preprocess([str(src)], remote, format=fmt, skip_bad=True, progress=False)
    assert report.skipped_file == f"{remote}/bcl_skipped.txt"
    assert "bcl_skipped.txt" in _keys(remote)
    download(f"{remote}/bcl_skipped.txt", tmp_path / "skipped.txt")
    lines = (tmp_path / "skipped.txt").read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines] == [
        [f"{src}:21", "no_trained_tokens"],
        [f"{src}:22", "no_trained_tokens"],
    ]
