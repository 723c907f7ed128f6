"""Real DDP (2 CPU ranks, gloo) through the LightningCLI entry and configs/cpu_demo.yaml.

Each run is a separate ``python -m lightning_module fit`` process (under pytest, strategy
``ddp`` would re-run pytest in the child). Checks: both ranks run the same number of packs,
no record reaches two ranks, every record is either yielded or reported in the plan's
remainder, a resume from a mid-epoch checkpoint in a new process yields exactly the
uninterrupted run's packs on each rank, and the same checkpoint resumed on one rank (elastic)
yields only records not consumed yet, each once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lightning_scripts.harness import make_trainer, pack_log, tiny_config

from bcl_stream.io.index import read_index
from bcl_stream.plan.epoch import ReaderConfig, full_plan
from lightning_module.callbacks import read_pack_log
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

PACK, WINDOW, STOP = 8, 4, 7


def write_config(tmp: Path, name: str, data: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "cpu_demo.yaml").read_text())
    cfg["trainer"].update(
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp / name)
    )
    for cb in cfg["trainer"]["callbacks"]:
        if cb["class_path"].endswith("PackLogger"):
            cb["init_args"] = {"directory": str(tmp / name / "logs"), "fresh": True}
        else:
            cb["init_args"].update(
                dirpath=str(tmp / name / "ckpt"), filename="{step}", every_n_train_steps=STOP
            )
    cfg["model"]["init_args"]["config"] = {
        "vocab_size": 256, "d_model": 16, "n_layers": 1, "n_heads": 2, "ffn_hidden": 32,
        "max_seq_len": 128,
    }  # fmt: skip
    cfg["data"].update(data=str(data), pack_size=PACK, window=WINDOW, num_workers=1, seed=5)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit(config: Path, *extra: str) -> None:
    # Keep shared memory: other streaming tests may be alive on this machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BCL_STREAM_KEEP_SHM": "1"}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_module", "fit", "--config", str(config), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


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
    assert len(ids) == len(set(ids)), "a record reached two ranks (or one rank twice)"
    assert len(ids) + sum(plan.remainder_counts().values()) == 300

    ckpt = tmp_path / "full" / "ckpt" / f"step={STOP}.ckpt"
    assert ckpt.is_file()
    fit(write_config(tmp_path, "resumed", mds_dir), "--ckpt_path", str(ckpt))
    resumed = logs(tmp_path, "resumed")
    for rank in range(2):
        want = [(x["step"], x["sample_ids"]) for x in full[rank][STOP:]]
        got = [(x["step"], x["sample_ids"]) for x in resumed[rank]]
        assert got == want, f"rank {rank}: resumed packs differ"

    # Elastic resume: the 2-rank checkpoint on 1 rank re-plans the records not yet consumed.
    module = BCLDataModule(
        str(mds_dir), pack_size=PACK, window=WINDOW, seed=5, layout="packed", max_seq_len=1024
    )
    trainer = make_trainer(tmp_path / "elastic", max_epochs=1)
    trainer.fit(TinyGPT(tiny_config()), module, ckpt_path=ckpt)
    consumed = {i for rank in full for x in rank[:STOP] for i in x["sample_ids"]}
    after = [i for x in pack_log(tmp_path / "elastic") for i in x["sample_ids"]]
    assert len(after) == len(set(after)) and not consumed & set(after)
    left = module.remainder_counts()
    assert left["consumed_before_resize"] == len(consumed) == 2 * STOP * PACK
    assert len(after) + sum(left.values()) == 300
