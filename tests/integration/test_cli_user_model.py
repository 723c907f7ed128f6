"""The training CLI with a model of the user's own (issue: "your own model in the training CLI").

``python -m lightning_module fit`` takes any LightningModule. The model here lives in a module
written to ``tmp_path`` and put on ``PYTHONPATH``, as a user's would: it is not TinyGPT, not a
subclass of it, and not in this repository. It trains on the balanced packs and writes what it
saw, so the test checks that every step got a batch of exactly B records. Also: an override
with ``--model`` on top of a TinyGPT config, a plan with no pack (one line, exit 2, not
"No training batches" and exit 0), and the program name in ``--help``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from lightning_scripts.harness import lightning_cli
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_log

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

USER_MODEL = '''
import json, os
import lightning.pytorch as pl
import torch


class PoolLM(pl.LightningModule):
    """Mean-pooled embeddings -> next-token logits; a stand-in for a user's own model."""

    def __init__(self, vocab: int = 512, width: int = 8, out: str = "seen.jsonl") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.vocab, self.out = vocab, out
        self.emb = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"] % self.vocab
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (self.emb(ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        logits = self.head(pooled).unsqueeze(1).expand(-1, ids.shape[1], -1)
        labels = batch["labels"].clone()
        labels[labels >= 0] %= self.vocab
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, self.vocab), labels.reshape(-1), ignore_index=-100
        )
        with open(self.out, "a") as fh:
            fh.write(json.dumps({"step": batch_idx, "ids": batch["sample_ids"].tolist()}) + "\\n")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
'''

PACK = 4


def config(tmp: Path, data: Path, model: dict) -> Path:
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 5,
            "logger": False,
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(tmp / "ckpt"),
                        "filename": "{step}",
                        "every_n_train_steps": 3,
                        "save_top_k": -1,
                    },
                }
            ],
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp / "run"),
        },
        "model": model,
        "data": {
            "data": str(data),
            "plan": {"pack_size": PACK, "window": 4},
            "batch": {"collate": "padded"},
        },
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "mymodel.py").write_text(USER_MODEL)
    proc: subprocess.CompletedProcess[str] = lightning_cli(ROOT, *args, cwd=tmp, path=[tmp])
    return proc


def seen(tmp: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (tmp / "seen.jsonl").read_text().splitlines()]


def test_user_model_by_class_path(mds_dir: Path, tmp_path: Path) -> None:
    model = {"class_path": "mymodel.PoolLM", "init_args": {"out": str(tmp_path / "seen.jsonl")}}
    proc = fit(tmp_path, "fit", "--config", str(config(tmp_path, mds_dir, model)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Our __len__ is exact per worker split: Lightning's generic warning about it is silenced.
    assert "has `__len__` defined" not in proc.stderr
    assert "BCLDataModule: bcl packing" in proc.stderr + proc.stdout
    steps = seen(tmp_path)
    assert [s["step"] for s in steps] == list(range(5))
    assert all(len(s["ids"]) == PACK for s in steps)
    check_every_record_once([s["ids"] for s in steps])
    # Resume the user's model from a mid-epoch checkpoint: the next packs, exactly.
    (tmp_path / "seen.jsonl").rename(tmp_path / "first.jsonl")
    ckpt = tmp_path / "ckpt" / "step=3.ckpt"
    proc = fit(tmp_path, "fit", "--config", str(tmp_path / "config.yaml"), "--ckpt_path", str(ckpt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_resumed_log([s["ids"] for s in steps], 3, [s["ids"] for s in seen(tmp_path)])


def test_model_flag_replaces_tinygpt_of_a_config(mds_dir: Path, tmp_path: Path) -> None:
    demo = yaml.safe_load((ROOT / "configs" / "cpu_demo.yaml").read_text())["model"]
    assert demo["class_path"] == "lightning_module.tinygpt.TinyGPT"  # the default stays
    path = config(tmp_path, mds_dir, demo)
    proc = fit(
        tmp_path, "fit", "--config", str(path), "--model", "mymodel.PoolLM",
        "--model.out", str(tmp_path / "seen.jsonl"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(seen(tmp_path)) == 5


def test_no_pack_is_one_line_and_exit_2(mds_dir: Path, tmp_path: Path) -> None:
    model = {"class_path": "mymodel.PoolLM"}
    path = config(tmp_path, mds_dir, model)
    proc = fit(tmp_path, "fit", "--config", str(path), "--data.plan.pack_size", "400")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no pack for any rank" in errors[0] and "300 records" in errors[0]
    assert "pack_size" in errors[0]
    debug = fit(tmp_path, "--debug", "fit", "--config", str(path), "--data.plan.pack_size", "400")
    assert debug.returncode == 2, debug.stderr[-3000:]
    assert "Traceback" in debug.stderr and "PlanError" in debug.stderr  # the type, not only text
    assert debug.stderr.strip().splitlines()[-1] == errors[0]


def test_help_names_the_command(tmp_path: Path) -> None:
    proc = fit(tmp_path, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: python -m lightning_module")
    assert "__main__.py" not in proc.stdout
