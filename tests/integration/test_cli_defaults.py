"""One set of defaults and honest summaries across ``plan``, ``read`` and ``simulate`` (issue
"the user's path, second pass", points 4, 5 and 9): real ``python -m bcl_stream.cli``
processes on a costed dataset of many shards.

- 4: with the same flags, ``plan --json`` and ``simulate --dataset --json`` plan the same
  epoch (the dataset's real shards, the same ranks per node): equal efficiency and packs, for
  every scope, with the default ranks per node and an explicit one; every summary says how
  many nodes it assumed.
- 5: ``simulate`` refuses a set-up with no pack, as ``plan`` does, instead of a NaN table.
- 9: ``plan --json`` carries every figure the text prints; ``--carry none`` is refused
  (``auto`` is W*B/4, 0 is off).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_process import bcl_stream_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

RECORDS = 600


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory, dataset_writers: tuple) -> Path:
    """600 records in about 24 shards: enough that shards of 4096 (the old assumption of
    ``simulate``) would have been one shard."""
    root = tmp_path_factory.mktemp("shards") / "ds"
    dataset_writers[0](root, RECORDS, seed=3, size_limit=1 << 11)
    return root


def ok_json(*args: str) -> dict:  # type: ignore[type-arg]
    proc = bcl_stream_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict = json.loads(proc.stdout)  # type: ignore[type-arg]
    return out


@pytest.mark.parametrize("ranks_per_node", [None, "2"])
def test_plan_and_simulate_dataset_plan_the_same_epoch(
    many_shards: Path, ranks_per_node: str | None
) -> None:
    flags = ["--pack-size", "4", "--window", "4"]
    if ranks_per_node is not None:
        flags += ["--ranks-per-node", ranks_per_node]
    sim = ok_json("simulate", "--dataset", str(many_shards), "--ranks", "4", *flags, "--json")
    shards = len(json.loads((many_shards / "bcl_index.json").read_text())["shards"])
    assert shards > 10 and sim["config"]["shards"] == shards  # the real shard table
    expected_per_node = 4 if ranks_per_node is None else 2  # one node of 4, or the flag
    assert sim["config"]["ranks_per_node"] == expected_per_node
    assert sim["config"]["nodes"] == 4 // expected_per_node
    for scope in ("rank", "node", "world"):
        plan = ok_json(
            "plan", str(many_shards), "--world-size", "4", *flags, "--scope", scope, "--json"
        )
        assert (plan["nodes"], plan["ranks_per_node"]) == (
            sim["config"]["nodes"],
            expected_per_node,
        )
        bcl = sim["strategies"][f"bcl-{scope}"]
        assert plan["packs_per_rank"] == bcl["packs_per_rank"] > 0
        assert plan["efficiency"] == pytest.approx(bcl["efficiency"], rel=1e-9), scope
        assert plan["remainder"]["count"] == bcl["records_left"]


def test_every_summary_says_the_nodes_it_assumed(many_shards: Path) -> None:
    flags = ["--pack-size", "4", "--window", "4"]
    said = "node layout: 2 nodes x 2 ranks (world 4)"
    plan = bcl_stream_cli(
        "plan", str(many_shards), "--world-size", "4", "--ranks-per-node", "2", *flags
    )
    assert plan.returncode == 0 and said in plan.stdout, plan.stderr
    sim = bcl_stream_cli(
        "simulate", "--dataset", str(many_shards), "--ranks", "4", "--ranks-per-node", "2", *flags
    )
    assert sim.returncode == 0 and said in sim.stdout.splitlines()[0], sim.stderr
    read = bcl_stream_cli(
        "read", str(many_shards), "--world-size", "4", "--ranks-per-node", "2", "--rank", "1",
        *flags, "--packs", "2",
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    assert f"rank 1 of 4 (node 0): 2 packs of 4 records; {said}" in read.stderr
    assert len(read.stdout.splitlines()) == 2  # stdout stays one pack per line
    default = bcl_stream_cli("plan", str(many_shards), "--world-size", "4", *flags)
    assert "node layout: 1 node x 4 ranks (world 4)" in default.stdout  # the default, said


def test_simulate_refuses_a_set_up_with_no_pack(mds_dir: Path, tmp_path: Path) -> None:
    big = ["--pack-size", "400", "--window", "2"]
    for source in (["--dataset", str(mds_dir)], ["--lengths", str(mds_dir / "bcl_costs.npy")]):
        proc = bcl_stream_cli("simulate", *source, "--ranks", "2", *big)
        assert proc.returncode == 2, proc.stdout[-2000:]
        (line,) = proc.stderr.strip().splitlines()
        assert "no pack for any rank" in line and "300 records" in line
        assert "needs at least 800" in line and "nan" not in proc.stdout.lower()


def test_plan_json_carries_every_figure_the_text_prints(many_shards: Path) -> None:
    flags = ["--world-size", "4", "--ranks-per-node", "2", "--pack-size", "4", "--window", "4"]
    flags += ["--grad-accum", "2"]
    text = bcl_stream_cli("plan", str(many_shards), *flags)
    assert text.returncode == 0, text.stderr
    assert "{" not in text.stdout  # no Python dict printed
    out = ok_json("plan", str(many_shards), *flags, "--json")
    for key in (
        "records", "shards", "world_size", "ranks_per_node", "nodes", "pack_size", "window",
        "scope", "packing", "epoch", "packs_per_rank", "efficiency", "cv_ranks", "remainder",
        "records_used", "efficiency_per_micro_batch", "efficiency_per_step",
        "micro_batches_per_step",
    ):  # fmt: skip
        assert key in out, key
    assert f"records {out['records']} in {out['shards']} shards" in text.stdout
    assert f"packs per rank {out['packs_per_rank']}" in text.stdout
    assert (
        f"balance efficiency per micro-batch {out['efficiency_per_micro_batch']:.4f}, per "
        f"optimizer step (2 micro-batches per rank) {out['efficiency_per_step']:.4f}"
    ) in text.stdout
    assert f"records not in a pack: {out['remainder']['count']}" in text.stdout
    # The efficiency is the packs' own: recomputed here from the printed packs and the costs.
    costs = np.load(many_shards / "bcl_costs.npy")["cost"].astype(np.float64)
    packs = np.array([rank["packs"] for rank in out["ranks"]])
    pack_costs = costs[packs].sum(axis=2)
    efficiency = pack_costs.mean(axis=0).sum() / pack_costs.max(axis=0).sum()
    assert out["efficiency"] == pytest.approx(efficiency, rel=1e-6)
    assert out["efficiency_per_micro_batch"] == out["efficiency"]
    # per optimizer step: each rank's 2 micro-batches of a step summed first
    steps = pack_costs.shape[1] // 2
    step_costs = pack_costs[:, : steps * 2].reshape(pack_costs.shape[0], steps, 2).sum(axis=2)
    per_step = step_costs.mean(axis=0).sum() / step_costs.max(axis=0).sum()
    assert out["micro_batches_per_step"] == 2
    assert out["efficiency_per_step"] == pytest.approx(per_step, rel=1e-6)
    assert out["records_used"] + out["remainder"]["count"] == out["records"] == RECORDS


def test_carry_none_is_refused_auto_and_zero_are_spelled_out(mds_dir: Path) -> None:
    from bcl_stream.cli import build_parser

    flags = ["--world-size", "2", "--pack-size", "4", "--window", "4"]
    proc = bcl_stream_cli("plan", str(mds_dir), *flags, "--carry", "none")
    assert proc.returncode == 2
    assert "ambiguous for --carry" in proc.stderr and "'auto'" in proc.stderr
    parse = build_parser().parse_args
    assert parse(["plan", "D", *flags, "--carry", "auto"]).carry is None  # W*B/4
    assert parse(["plan", "D", *flags, "--carry", "0"]).carry == 0
    assert "--carry INT|auto" in bcl_stream_cli("plan", "--help").stdout
    assert bcl_stream_cli("plan", str(mds_dir), *flags, "--carry", "auto").returncode == 0
