"""Readers in a real 2-process gloo group (a separate script): a config built without a world
size takes the group's, a reader without a rank takes its process's, an explicit rank or
data-parallel size wins, and a world size that contradicts the group is refused in one line.
Before the group exists the world size is required (checked in the same processes: the pytest
process may hold a group another test left)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bcl_stream import ReaderConfig
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.io.remote import open_cost_index

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]
SCRIPT = Path(__file__).parent / "scripts" / "gloo_defaults.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_readers_take_world_size_and_rank_from_the_group(wds_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BCL_STREAM_KEEP_SHM": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(wds_dir), str(free_port()), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    first_error = max(proc.stderr.find("Traceback"), 0)
    assert proc.returncode == 0, proc.stderr[first_error : first_error + 6000]
    ranks = json.loads(out.read_text())
    index, _ = open_cost_index(str(wds_dir))
    plan = full_plan(index, ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=9), 0)
    for got in ranks:
        r = got["rank"]
        assert got["before_group"].startswith("world_size is required")
        assert got["world_size"] == 2
        assert got["default_rank"] == got["mixture_rank"] == r
        assert got["default_first"] == plan.rank_packs(r)[0].tolist()
        assert got["explicit_rank"] == 1 - r  # the caller's rank wins over the group's
        assert got["explicit_first"] == plan.rank_packs(1 - r)[0].tolist()
        assert got["shared_rank"] == 0
        for refused in (got["contradiction"], got["dp_without_rank"]):
            assert "\n" not in refused
        assert "world_size=3 but the process group has 2 ranks" in got["contradiction"]
        assert "world_size=1 but the process group has 2 ranks" in got["dp_without_rank"]
