"""Tensor parallelism under Lightning's ``ModelParallelStrategy``: 4 CPU processes (gloo) as
2 data-parallel x 2 tensor-parallel, with Fabric and with the Trainer, one epoch of TinyGPT
with real tensor parallelism on its MLPs (``lightning_module.parallel``).

Checks, per run: the two processes of a tensor-parallel group yield identical packs (and, one
model split over them, identical losses); the two data-parallel ranks yield different records;
the packs are exactly those of the plan made directly for 2 ranks (not the one for the 4
processes); every record once across data-parallel ranks or in the plan's remainder; equal
pack counts; Mosaic Streaming was given the physical layout (4 processes on this node). The
Trainer's distributed checkpoint resumes exactly in new processes.

And ``parallelize`` itself: split over 2 processes, TinyGPT and a tiny Hugging Face Llama
compute what the unsplit model computes, before and after an optimizer step.

Each run is a subprocess script (``lightning_scripts/mesh_fit.py``): Lightning launches the
other processes by re-running the script, which under pytest would re-run pytest.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_process import run_script
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_log

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.index import read_index
from lightning_module.callbacks import read_pack_log

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "lightning_scripts" / "mesh_fit.py"
PACK, WINDOW, SEED, DP, TP = 8, 4, 5, 2, 2
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


Run = tuple[list[list[dict[str, Any]]], list[dict[str, Any]], str]


def run(mode: str, data: Path, out: Path, *resume: str) -> Run:
    """Run the script; the 4 processes' pack logs, their process reports and the output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BCL_STREAM_KEEP_SHM": "1"}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    proc = run_script(SCRIPT, mode, str(data), str(out), *resume, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = [read_pack_log(out / "logs" / f"packs_rank{g}.jsonl") for g in range(DP * TP)]
    reports = [json.loads((out / f"process{g}.json").read_text()) for g in range(DP * TP)]
    return logs, reports, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trainer_run(mds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The Trainer's epoch (a checkpoint after step 7), shared by the layout and resume tests."""
    out = tmp_path_factory.mktemp("mesh") / "trainer"
    return out, run("trainer", mds_dir, out)


@pytest.mark.parametrize("mode", ["fabric", "trainer"])
def test_tensor_parallel_groups_share_packs_and_the_plan_is_for_data_parallel_ranks(
    mode: str, mds_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if mode == "trainer":
        logs, reports, output = request.getfixturevalue("trainer_run")[1]
    else:
        logs, reports, output = run(mode, mds_dir, tmp_path / mode)
    index = read_index(mds_dir)
    config = {"pack_size": PACK, "window": WINDOW, "seed": SEED, "scope": "node"}
    plan = full_plan(
        index, ReaderConfig.build(world_size=DP, ranks_per_node=DP, layout="packed", **config), 0
    )
    per_process = full_plan(
        index, ReaderConfig.build(world_size=DP * TP, ranks_per_node=DP * TP, **config), 0
    )
    packs = [[line["sample_ids"] for line in log] for log in logs]
    said = "on 2 ranks = 1 node x 2 ranks per node (data-parallel ranks of 2 processes each)"
    assert f"{plan.n_packs} packs of {PACK} records per rank in epoch 0 {said}" in output
    for g, report in enumerate(reports):
        dp_rank = g // TP
        assert report["layout"] == {
            "rank": dp_rank, "world_size": DP, "ranks_per_node": DP, "group_size": TP,
            "local_processes": DP * TP,
        }  # fmt: skip
        assert report["plan"] == {"world_size": DP, "ranks_per_node": DP}
        # streaming: every process of the node, so one shared cache and one leader per node
        assert report["streaming_env"] == {
            "RANK": str(g), "WORLD_SIZE": str(DP * TP), "LOCAL_WORLD_SIZE": str(DP * TP),
        }  # fmt: skip
        assert packs[g] == plan.rank_packs(dp_rank).tolist(), f"process {g}"
        assert [line["rank"] for line in logs[g]] == [g] * plan.n_packs
    # the discriminating control: a plan for the 4 processes would have given other packs
    assert packs[0] != per_process.rank_packs(0).tolist()
    for first in range(0, DP * TP, TP):  # a tensor-parallel group: one model, one stream
        group = range(first, first + TP)
        assert all(packs[g] == packs[first] for g in group)
        losses = [reports[g]["losses"] for g in group]
        assert len(losses[0]) == plan.n_packs
        assert all(np.allclose(x, losses[0], rtol=0, atol=1e-6) for x in losses)
    assert len({len(p) for p in packs}) == 1  # equal pack counts: collectives never hang
    assert packs[0] != packs[TP]
    ids = [i for dp_rank in range(DP) for pack in packs[dp_rank * TP] for i in pack]
    assert all(len(pack) == PACK for p in packs for pack in p)
    check_every_record_once(ids, what="a record reached two data-parallel ranks")
    assert len(ids) + sum(plan.remainder_counts().values()) == len(index) == 300


def test_a_tensor_parallel_trainer_resumes_exactly(
    mds_dir: Path, tmp_path: Path, trainer_run: tuple[Path, Run]
) -> None:
    """The distributed checkpoint after step 7, resumed in new processes: every process yields
    the uninterrupted run's packs from step 7 on, with the same losses (model, optimizer and
    the data cursor restored)."""
    out, (full_logs, full_reports, _) = trainer_run
    ckpt = out / "ckpt" / "step=7.ckpt"
    assert ckpt.is_dir()  # one file per process and the metadata
    logs, reports, _ = run("trainer", mds_dir, tmp_path / "resumed", str(ckpt))
    for g in range(DP * TP):  # one resumed run of 4 processes, compared process by process
        steps = [[(x["step"], x["sample_ids"]) for x in log[g]] for log in (full_logs, logs)]
        assert [step for step, _ in steps[0]] == list(range(len(steps[0])))
        check_resumed_log(steps[0], 7, steps[1])
        assert len(steps[1]) == len(steps[0]) - 7 > 0
        assert np.allclose(reports[g]["losses"], full_reports[g]["losses"][7:], atol=1e-5)


def test_parallelize_splits_tinygpt_and_llama_without_changing_what_they_compute(
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "tp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    script = HERE / "lightning_scripts" / "tp_equivalence.py"
    proc = run_script(script, str(port), str(out), env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    # TinyGPT: gate/up/down of 2 blocks; Llama: q/k/v/o and gate/up/down of 2 layers
    assert {k: v["split_layers"] for k, v in results.items()} == {"tinygpt": 6, "llama": 14}
    for name, r in results.items():
        assert r["max_logit_diff"] < 1e-5, name
        assert abs(r["loss"] - r["loss_unsplit"]) < 1e-5, name
        assert abs(r["step_loss"] - r["loss"]) > 1e-2, name  # the step changed the model
        assert r["step_loss_diff"] < 1e-4, name  # and changed both copies alike
