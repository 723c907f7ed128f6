"""Validation and test through BCLDataModule (issue "the user's path, second pass", point 6).

- ``fit`` with ``eval.val_data`` on 2 real DDP ranks (gloo) through ``python -m lightning_module``:
  every validation pass yields every validation record exactly once across the ranks, both
  ranks run the same number of validation steps (``sync_dist`` would hang otherwise), packs
  hold at most B records, and training is unaffected (exactly B records per step);
- ``eval.val_streams``: one loader per stream, each stream read whole;
- ``Trainer.test`` with ``eval.test_data`` and balanced packing, in process; no validation data: no
  validation loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning_scripts.harness import lightning_cli, tiny_config, tiny_fit_config
from pack_oracles import check_every_record_once

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACK, VAL_RECORDS = 8, 101

RECORDING_MODEL = '''
import json
from lightning_module.tinygpt import TinyGPT, TinyGPTConfig


class RecordingGPT(TinyGPT):
    """TinyGPT that writes every validation pack it sees, per rank."""

    def __init__(self, config: TinyGPTConfig, out: str = ".") -> None:
        super().__init__(config)
        self.out = out

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        line = {"pass": self.global_step, "loader": dataloader_idx,
                "ids": batch["sample_ids"].tolist()}
        with open(f"{self.out}/val_rank{self.global_rank}.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\\n")
        return super().validation_step(batch, batch_idx)
'''


@pytest.fixture(scope="module")
def val_dir(tmp_path_factory: pytest.TempPathFactory, dataset_writers: tuple) -> Path:
    root = tmp_path_factory.mktemp("val") / "ds"
    dataset_writers[0](root, VAL_RECORDS, seed=7)
    return root


def write_config(tmp: Path, data: Path, validation: dict) -> Path:  # type: ignore[type-arg]
    (tmp / "recording.py").write_text(RECORDING_MODEL)
    trainer = {"devices": 2, "strategy": "ddp", "max_steps": 4, "val_check_interval": 2}
    trainer["num_sanity_val_steps"] = 0
    fields = {
        "data": str(data), "plan": {"pack_size": PACK, "window": 4}, "batch": {"collate": "packed"},
        "eval": validation,
    }  # fmt: skip
    return tiny_fit_config(
        tmp, fields, trainer=trainer, model="recording.RecordingGPT", model_args={"out": str(tmp)}
    )


def seen(tmp: Path, rank: int) -> list[dict]:  # type: ignore[type-arg]
    path = tmp / f"val_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_fit_with_validation_on_two_ddp_ranks(mds_dir: Path, val_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, mds_dir, {"val_data": str(val_dir)})
    proc = lightning_cli(ROOT, "fit", "--config", str(config), cwd=tmp_path, path=[tmp_path])
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [seen(tmp_path, r) for r in range(2)]
    passes = sorted({line["pass"] for line in ranks[0]})
    assert passes == [2, 4]  # val_check_interval=2, max_steps=4
    for p in passes:
        steps = [[line["ids"] for line in rank if line["pass"] == p] for rank in ranks]
        assert len(steps[0]) == len(steps[1]) > 0  # the same step count on both ranks
        check_every_record_once(steps, VAL_RECORDS, what=f"validation pass {p}, both ranks")
        assert all(1 <= len(pack) <= PACK for rank in steps for pack in rank)
    for rank in range(2):  # training still gets exactly B records per step
        lines = (tmp_path / "logs" / f"packs_rank{rank}.jsonl").read_text().splitlines()
        assert [len(json.loads(x)["sample_ids"]) for x in lines] == [PACK] * 4


def test_val_streams_give_one_loader_per_stream(
    mds_dir: Path, val_dir: Path, tmp_path: Path
) -> None:
    """In process, one rank: each stream is its own loader, read whole (weights ignored)."""
    from lightning_module import BCLDataModule

    module = BCLDataModule(
        str(mds_dir),
        plan={"pack_size": PACK, "window": 4},
        eval={"val_streams": [f"{val_dir}:proportion=0.2", str(mds_dir)]},
    )
    module.setup_for(0, 1, 1)
    loaders = module.val_dataloader()
    assert len(loaders) == 2
    for loader, records in zip(loaders, (VAL_RECORDS, 300), strict=True):
        batches = list(loader)
        assert len(batches) == len(loader)
        check_every_record_once([b["sample_ids"] for b in batches], records)
    from lightning.pytorch.utilities.model_helpers import is_overridden

    assert not is_overridden("test_dataloader", module)  # no test data: no hook for Lightning


def test_a_test_pass_with_balanced_packing_reads_every_record_once(
    mds_dir: Path, val_dir: Path, tmp_path: Path
) -> None:
    from lightning_module import BCLDataModule
    from lightning_module.tinygpt import TinyGPT
    from tests.trainers import cpu_trainer

    got: list[list[int]] = []

    class Recording(TinyGPT):
        def test_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            got.append(batch["sample_ids"].tolist())
            return super().test_step(batch, batch_idx)

    module = BCLDataModule(
        str(mds_dir), plan={"pack_size": PACK, "window": 4},
        eval={"test_data": str(val_dir), "packing": "bcl"},
        batch={"collate": "packed", "max_seq_len": 128},
    )  # fmt: skip
    result = cpu_trainer().test(Recording(tiny_config()), module)
    check_every_record_once(got, VAL_RECORDS)
    assert result and "test_loss" in result[0]
    costs = __import__("numpy").load(val_dir / "bcl_costs.npy")["cost"]
    firsts = [costs[pack].max() for pack in got]
    assert firsts == sorted(firsts, reverse=True)  # balanced: packs in cost order
