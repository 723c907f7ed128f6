"""Fabric: ``fabric.save``/``fabric.load`` of model, optimizer and the DataModule resume the
exact packs (mid-epoch, at the epoch end, into the next epoch) and the exact weights."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from lightning_scripts.harness import pack_log, tiny_config
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_runs

from tools import train_fabric

pytestmark = pytest.mark.slow

PACKS_PER_EPOCH = 300 // 8


def run(tool: ModuleType, data: Path, workdir: Path, steps: int, **kw: Any) -> dict[str, Any]:
    return tool.train(
        str(data),
        workdir,
        steps=steps,
        model_config=tiny_config(),
        plan={"pack_size": 8, "window": 4},
        **kw,
    )


def entries(workdir: Path) -> list[tuple[int, int, int, list[int]]]:
    return [(x["step"], x["epoch"], x["batch_idx"], x["sample_ids"]) for x in pack_log(workdir)]


def test_fabric_save_load_resumes_exactly(mds_dir: Path, tmp_path: Path) -> None:
    tool = train_fabric
    total = PACKS_PER_EPOCH + 6
    saves = (4, PACKS_PER_EPOCH, PACKS_PER_EPOCH + 2)  # mid-epoch, epoch end, into the next
    out = run(tool, mds_dir, tmp_path / "full", total, save_at=saves)
    assert out["step"] == total
    assert out["cursor"]["reader"]["epoch"] == 1
    assert out["cursor"]["reader"]["packs_consumed"] == 6
    full = entries(tmp_path / "full")
    assert [e[1] for e in full] == [0] * PACKS_PER_EPOCH + [1] * 6
    assert [e[2] for e in full] == list(range(PACKS_PER_EPOCH)) + list(range(6))
    epoch0 = [i for e in full if e[1] == 0 for i in e[3]]
    check_every_record_once(epoch0)
    assert len(epoch0) == PACKS_PER_EPOCH * 8

    def resume(step: int) -> list[tuple[int, int, int, list[int]]]:
        ckpt = tmp_path / "full" / "ckpt" / f"step={step}.ckpt"
        saved = torch.load(ckpt, weights_only=False)
        assert saved["step"] == step
        resumed = tmp_path / f"resumed{step}"
        run(tool, mds_dir, resumed, total, resume=ckpt)
        return entries(resumed)

    check_resumed_runs(full, resume, saves)

    # Same weights at the end whether or not the run was interrupted (CPU, deterministic).
    final_full = tmp_path / "full2"
    run(tool, mds_dir, final_full, PACKS_PER_EPOCH + 2, save_at=(PACKS_PER_EPOCH + 2,))
    resumed_w = tmp_path / "resumed_w"
    run(
        tool,
        mds_dir,
        resumed_w,
        PACKS_PER_EPOCH + 2,
        resume=tmp_path / "full" / "ckpt" / "step=4.ckpt",
        save_at=(PACKS_PER_EPOCH + 2,),
    )
    a = torch.load(final_full / "ckpt" / f"step={PACKS_PER_EPOCH + 2}.ckpt", weights_only=False)
    b = torch.load(resumed_w / "ckpt" / f"step={PACKS_PER_EPOCH + 2}.ckpt", weights_only=False)
    for name, tensor in a["model"].items():
        torch.testing.assert_close(tensor, b["model"][name], msg=f"weights differ: {name}")
