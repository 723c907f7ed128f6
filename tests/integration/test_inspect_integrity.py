"""``inspect`` checks every MDS shard as ``read`` does (issue "the user's path, second pass",
point 3: a truncated shard was "integrity: ok", exit 0, and ``read`` then refused it): size,
header and content hash of every shard, with the time it took in the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

PLAN = ["--world-size", "1", "--pack-size", "4", "--window", "4"]


def shard(root: Path, i: int) -> Path:
    entry = json.loads((root / "index.json").read_text())["shards"][i]
    return root / entry["raw_data"]["basename"]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte"])
def test_inspect_finds_what_read_refuses(mds_dir: Path, tmp_path: Path, damage: str) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(mds_dir, copy)
    ok = bcl_stream_cli("inspect", str(copy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "integrity: ok (every shard's size, header and content hash checked in" in ok.stdout
    target = shard(copy, 3)
    data = bytearray(target.read_bytes())
    if damage == "truncated":
        target.write_bytes(bytes(data[: len(data) - 10]))
        expected = "truncated"
    else:
        data[-5] ^= 0xFF  # inside the last record's payload: size and header still right
        target.write_bytes(bytes(data))
        expected = "content hash differs"
    proc = bcl_stream_cli("inspect", str(copy), "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert not report["ok"] and report["integrity_seconds"] >= 0
    assert any(target.name in p and expected in p for p in report["problems"]), report["problems"]
    read = bcl_stream_cli("read", str(copy), *PLAN, "--rank", "0")
    assert read.returncode == 2 and target.name in read.stderr and expected in read.stderr
