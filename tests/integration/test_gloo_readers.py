"""A real 2-process gloo run (a separate script, not a DDP strategy under pytest): both ranks
yield their plan, the same number of packs (a collective per pack never hangs), and identical
loader states. In the same group: a config built without a world size takes the group's, a
reader without a rank takes its process's, an explicit rank or data-parallel size wins, and a
world size that contradicts the group is refused in one line; before the group exists the
world size is required."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from cli_process import ROOT, run_script
from pack_oracles import check_every_record_once

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.remote import open_cost_index

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]
SCRIPT = Path(__file__).parent / "scripts" / "gloo_readers.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_follow_the_plan(mds_dir: Path, wds_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # Keep shared memory: other streaming jobs may be alive on this machine.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "BCL_STREAM_KEEP_SHM": "1",
        "PYTHONPATH": str(ROOT),
    }
    proc = run_script(SCRIPT, str(mds_dir), str(wds_dir), str(free_port()), str(out), env=env)
    first_error = max(proc.stderr.find("Traceback"), 0)
    assert proc.returncode == 0, proc.stderr[first_error : first_error + 6000]
    result = json.loads(out.read_text())
    for fmt, root in (("mds", mds_dir), ("wds", wds_dir)):
        check_ranks(result[fmt], root)
    assert "world_size=3 but the process group has 2 ranks" in result["wrong_world_error"]
    check_defaults(result["defaults"], wds_dir)


def check_defaults(ranks: list[dict[str, Any]], root: Path) -> None:
    index, _ = open_cost_index(str(root))
    # the group's 2 processes on one node (LOCAL_WORLD_SIZE=2): one node of 2 ranks
    one_node = ReaderConfig.build(world_size=2, ranks_per_node=2, pack_size=4, window=3, seed=9)
    plan = full_plan(index, one_node, 0)
    for got in ranks:
        r = got["rank"]
        assert got["before_group"].startswith("world_size is required: no torch process group")
        assert (got["world_size"], got["ranks_per_node"]) == (2, 2)
        assert got["default_rank"] == got["mixture_rank"] == r
        assert got["default_first"] == plan.rank_packs(r)[0].tolist()
        assert got["explicit_rank"] == 1 - r  # the caller's rank wins over the group's
        assert got["explicit_first"] == plan.rank_packs(1 - r)[0].tolist()
        assert got["shared_rank"] == 0
        assert "world_size=3 but the process group has 2 ranks" in got["contradiction"]
        assert "world_size=1 but the process group has 2 ranks" in got["dp_without_rank"]
        assert "\n" not in got["contradiction"] + got["dp_without_rank"]


def check_ranks(ranks: list[dict[str, Any]], root: Path) -> None:
    index, _ = open_cost_index(str(root))
    config = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=9)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["len"] == ranks[1]["len"]
    assert ranks[0]["states"] == ranks[1]["states"]  # what Lightning saves from rank 0 fits rank 1
    for epoch in range(2):
        plan = full_plan(index, config, epoch)
        for r in ranks:
            assert r["epochs"][epoch] == plan.rank_packs(r["rank"]).tolist()
        used = [r["epochs"][epoch] for r in ranks]
        check_every_record_once(
            used, len(index), left_out=plan.plan.remainder, what=f"epoch {epoch}"
        )
