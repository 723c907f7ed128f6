"""Real DDP (2 CPU ranks, gloo) through the LightningCLI entry and configs/cpu_demo.yaml.

Each run is a separate ``python -m lightning_module fit`` process (under pytest, strategy
``ddp`` would re-run pytest in the child). Checks: both ranks run the same number of packs,
no record reaches two ranks, every record is either yielded or reported in the plan's
remainder, a resume from a mid-epoch checkpoint in a new process yields exactly the
uninterrupted run's packs on each rank, and the same checkpoint resumed on one rank (elastic)
yields only records not consumed yet, each once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lightning_scripts.harness import cli_fit, cli_run_config, make_trainer, pack_log, tiny_config
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_log

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.index import read_index
from lightning_module.callbacks import read_pack_log
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

PACK, WINDOW, STOP = 8, 4, 7


def write_config(tmp: Path, name: str, data: Path) -> Path:
    return cli_run_config(
        ROOT / "configs" / "cpu_demo.yaml",
        tmp,
        name,
        STOP,
        {
            "data": str(data),
            "plan": {"pack_size": PACK, "window": WINDOW},
            "loader": {"num_workers": 1},
            "seed": 5,
        },
    )


def fit(config: Path, *extra: str) -> None:
    cli_fit(ROOT, config, *extra)


def logs(tmp: Path, name: str) -> list[list[dict]]:
    return [read_pack_log(tmp / name / "logs" / f"packs_rank{r}.jsonl") for r in range(2)]


def test_ddp_two_ranks_balanced_disjoint_and_resumable(mds_dir: Path, tmp_path: Path) -> None:
    fit(write_config(tmp_path, "full", mds_dir))
    full = logs(tmp_path, "full")
    config = ReaderConfig.build(
        world_size=2, pack_size=PACK, window=WINDOW, ranks_per_node=2, seed=5
    )
    plan = full_plan(read_index(mds_dir), config, 0)
    assert [len(rank) for rank in full] == [plan.n_packs, plan.n_packs]
    for rank, lines in enumerate(full):
        assert [x["sample_ids"] for x in lines] == plan.rank_packs(rank).tolist()
        assert [x["step"] for x in lines] == list(range(plan.n_packs))
        assert all(x["rank"] == rank for x in lines)
    ids = [i for rank in full for x in rank for i in x["sample_ids"]]
    check_every_record_once(ids, what="a record reached two ranks (or one rank twice)")
    assert len(ids) + sum(plan.remainder_counts().values()) == 300

    ckpt = tmp_path / "full" / "ckpt" / f"step={STOP}.ckpt"
    assert ckpt.is_file()
    fit(write_config(tmp_path, "resumed", mds_dir), "--ckpt_path", str(ckpt))
    resumed = logs(tmp_path, "resumed")
    for rank in range(2):  # one resumed DDP run, compared rank by rank
        steps = [[(x["step"], x["sample_ids"]) for x in log[rank]] for log in (full, resumed)]
        check_resumed_log(steps[0], STOP, steps[1])

    # Elastic resume: the 2-rank checkpoint on 1 rank re-plans the records not yet consumed.
    module = BCLDataModule(
        str(mds_dir), plan={"pack_size": PACK, "window": WINDOW}, seed=5,
        batch={"collate": "packed", "max_seq_len": 1024},
    )  # fmt: skip
    trainer = make_trainer(tmp_path / "elastic", max_epochs=1)
    trainer.fit(TinyGPT(tiny_config()), module, ckpt_path=ckpt)
    consumed = {i for rank in full for x in rank[:STOP] for i in x["sample_ids"]}
    after = [i for x in pack_log(tmp_path / "elastic") for i in x["sample_ids"]]
    check_every_record_once(
        [sorted(consumed), after], what="a record consumed before the resize came again"
    )
    left = module.remainder_counts()
    assert left["consumed_before_resize"] == len(consumed) == 2 * STOP * PACK
    assert len(after) + sum(left.values()) == 300


def test_ddp_accumulation_reaches_the_plan(mds_dir: Path, tmp_path: Path) -> None:
    """2 gloo ranks with ``--trainer.accumulate_grad_batches 2`` and no planner knob: the plan
    deals each optimizer step's packs for per-step balance (grad_accum=2, from the trainer),
    which on this data gives other packs than the per-micro-batch plan, and the checkpoint's
    cursor records it."""
    plan = {"pack_size": PACK, "window": WINDOW, "scope": "node"}
    data = {"data": str(mds_dir), "plan": plan, "seed": 5}
    config = cli_run_config(ROOT / "configs" / "cpu_demo.yaml", tmp_path, "accum", STOP, data)
    fit(config, "--trainer.accumulate_grad_batches", "2")
    trained = logs(tmp_path, "accum")
    index = read_index(mds_dir)
    plans = {
        g: full_plan(
            index,
            ReaderConfig.build(
                world_size=2, pack_size=PACK, window=WINDOW, ranks_per_node=2, seed=5,
                scope="node", layout="packed", grad_accum=g,
            ),
            0,
        )
        for g in (1, 2)
    }  # fmt: skip
    assert not np.array_equal(plans[1].plan.packs, plans[2].plan.packs)
    for rank, lines in enumerate(trained):
        assert [x["sample_ids"] for x in lines] == plans[2].rank_packs(rank).tolist()
        assert [x["step"] for x in lines] == [k // 2 for k in range(len(lines))]
    ckpt = torch.load(
        tmp_path / "accum" / "ckpt" / f"step={STOP}.ckpt", map_location="cpu", weights_only=False
    )
    assert ckpt["BCLDataModule"]["reader"]["config"]["plan"]["grad_accum"] == 2
