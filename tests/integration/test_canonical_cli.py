"""``--canonical-ranks`` on ``plan``, ``read`` and ``simulate`` (real ``python -m bcl_stream.cli``
processes): the packs of every optimizer step are the same at 4 and 2 physical ranks, ``read``
yields what ``plan`` prints, and a size that does not divide V is refused with the ones that do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

COMMON = ["--pack-size", "4", "--window", "4", "--scope", "world", "--grad-accum", "1"]
CANONICAL = ["--canonical-ranks", "4", "--canonical-ranks-per-node", "2"]


def run_json(*args: str) -> dict:  # type: ignore[type-arg]
    proc = bcl_stream_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict = json.loads(proc.stdout)  # type: ignore[type-arg]
    return out


def test_plan_read_and_simulate_take_canonical_ranks(mds_dir: Path) -> None:
    by_size, efficiency = {}, {}
    for r in (4, 2):
        layout = ["--world-size", str(r), "--ranks-per-node", "2"]
        out = run_json("plan", str(mds_dir), *layout, *COMMON, *CANONICAL, "--json")
        assert out["canonical_ranks"] == 4 and out["world_size"] == r
        efficiency[r] = out["efficiency"]
        per = 4 // r  # micro-batches per step: G_c * V / R with G_c = 1
        ranks = [x["packs"] for x in out["ranks"]]
        by_size[r] = [
            sorted(p for rank in ranks for p in rank[s : s + per])
            for s in range(0, len(ranks[0]), per)
        ]
        read = run_json("read", str(mds_dir), *layout, *COMMON, *CANONICAL, "--rank", "1", "--json")
        assert read["packs"] == ranks[1]
    assert by_size[4] == by_size[2]
    sim = run_json(
        "simulate", "--dataset", str(mds_dir), "--ranks", "2", "--ranks-per-node", "2",
        "--pack-size", "4", "--window", "4", "--grad-accum", "2", *CANONICAL, "--json",
    )  # fmt: skip
    # simulate scores the same physical micro-batches plan prints (G = G_c * V/R = 2)
    assert sim["config"]["canonical_ranks"] == 4
    assert sim["strategies"]["bcl-world"]["efficiency"] == pytest.approx(efficiency[2])
    proc = bcl_stream_cli(
        "plan", str(mds_dir), "--world-size", "3", "--ranks-per-node", "1", *COMMON, *CANONICAL
    )
    assert proc.returncode != 0
    assert "cannot run on 3 data-parallel ranks" in proc.stderr
    assert "one of [1, 2, 4]" in proc.stderr
    assert "Traceback" not in proc.stderr
