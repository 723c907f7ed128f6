"""The smaller points of issue "the user's path, second pass" (point 9), each with the real
command or the real Trainer. Covered elsewhere: ``plan --json`` figures and ``--carry none``
(``test_cli_defaults.py``), "at at column" and a failed preprocess's empty output
(``test_usage_errors.py``), a long value quoted in a one-line error
(``test_existing_layouts.py``, ``tests/unit/test_record_source.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli
from lightning_scripts.harness import SaveAtSteps, tiny_config

pytestmark = pytest.mark.slow


def test_pack_log_has_each_step_once_after_a_resume(mds_dir: Path, tmp_path: Path) -> None:
    """A run logs steps 0-5 and checkpoints at 3; resumed from there into the same log
    (``fresh=False``, the default), steps 3-5 are not there twice."""
    import lightning.pytorch as pl

    from lightning_module import BCLDataModule, PackLogger, read_pack_log
    from lightning_module.tinygpt import TinyGPT
    from tests.trainers import cpu_trainer

    def trainer(*callbacks: pl.Callback) -> pl.Trainer:
        return cpu_trainer(max_steps=6, callbacks=[PackLogger(tmp_path / "logs"), *callbacks])

    def module() -> BCLDataModule:
        plan, batch = {"pack_size": 4, "window": 4}, {"collate": "packed", "max_seq_len": 128}
        return BCLDataModule(str(mds_dir), plan=plan, batch=batch)

    trainer(SaveAtSteps(tmp_path / "ckpt", [3])).fit(TinyGPT(tiny_config()), module())
    log = tmp_path / "logs" / "packs_rank0.jsonl"
    first = read_pack_log(log)
    assert [x["step"] for x in first] == list(range(6))
    trainer().fit(TinyGPT(tiny_config()), module(), ckpt_path=tmp_path / "ckpt" / "step=3.ckpt")
    after = read_pack_log(log)
    assert [x["step"] for x in after] == list(range(6))  # not 0..5 then 3..5 again
    assert [x["sample_ids"] for x in after] == [x["sample_ids"] for x in first]


def test_datamodule_and_plan_name_the_same_epoch(mds_dir: Path) -> None:
    from bcl_stream.errors import PlanError
    from lightning_module import BCLDataModule

    module = BCLDataModule(str(mds_dir), plan={"pack_size": 400, "window": 2})
    module.setup_for(0, 1, 1)
    with pytest.raises(PlanError, match="no pack for any rank in epoch 0") as info:
        module.train_dataloader()
    plan = bcl_stream_cli(
        "plan", str(mds_dir), "--world-size", "1", "--pack-size", "400", "--window", "2"
    )
    assert plan.returncode == 2 and "in epoch 0" in plan.stderr
    said = str(info.value).split(":", 1)[1].split(" per epoch)")[0]
    assert said in plan.stderr  # the same words after the path (the fix names its options)


def test_progress_bars_show_their_total(mds_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i} " * 20}) + "\n" for i in range(50)))
    pre = bcl_stream_cli("preprocess", str(data), "--output", str(tmp_path / "out"))
    assert pre.returncode == 0, pre.stderr[-2000:]
    size = data.stat().st_size
    assert "preprocess: 100%" in pre.stderr and f"{size / 1000:.1f}k" in pre.stderr
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(mds_dir, plain)
    ann = bcl_stream_cli("annotate", str(plain), "--overwrite")
    assert ann.returncode == 0, ann.stderr[-2000:]
    assert "annotate: 100%" in ann.stderr and "300/300" in ann.stderr  # records, known


def test_a_shard_file_given_as_dir_is_named_so(mds_dir: Path) -> None:
    entry = json.loads((mds_dir / "index.json").read_text())["shards"][0]
    shard = mds_dir / entry["raw_data"]["basename"]
    proc = bcl_stream_cli(
        "plan", str(shard), "--world-size", "1", "--pack-size", "4", "--window", "4"
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "a file, not a dataset directory" in line and f"({mds_dir})" in line
    assert "no such" not in line
