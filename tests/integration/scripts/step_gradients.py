"""One optimizer step of HFCausalLM on 2 real DDP ranks (gloo, ``ddp_fork``) with gradient
accumulation 2, SGD with lr 1: the parameter change is minus the step's gradient.

Usage: python step_gradients.py RUNS, RUNS a JSON list of runs, each ``{"data", "model_dir", "out",
"scope", "max_seq_len"}`` (``max_seq_len`` 0: none) with optional ``"budget"`` (a token budget:
``contract="tokens"`` with ``max_tokens`` BUDGET; 0 or none: B=2 records a micro-batch) and
``"collate"`` (``packed`` by default, or ``padded``) and ``"processor"`` (image-text data: the
processor directory, ``batch.processor``; the model then a vision-language one). The runs share this process (one import
of Lightning, transformers and streaming for all; each fit forks its own 2 ranks), each from
the same parameters (seed 0). Each writes OUT/init.pt (parameters before), OUT/final.pt (after
the step, rank 0), OUT/batches_rank{r}.json (each micro-batch's record ids, trained tokens and
``step_loss_tokens`` if any) and OUT/normalization.txt (the DataModule's).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_module.datamodule import BCLDataModule
from lightning_module.hf_causal_lm import HFCausalLM
from tests.trainers import cpu_trainer

torch.set_num_threads(1)


class SGDCausalLM(HFCausalLM):
    """HFCausalLM with plain SGD (lr 1, no momentum): the update is the gradient itself."""

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1.0)


class Record(pl.Callback):
    """Each rank's micro-batches, and rank 0's parameters after the step."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, i: int) -> None:
        entry = {"sample_ids": batch["sample_ids"].tolist()}
        for key in ("loss_tokens", "step_loss_tokens", "rank_step_loss_tokens"):
            entry[key] = int(batch[key]) if key in batch else None
        self.batches.append(entry)

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        rank = trainer.global_rank
        (self.out / f"batches_rank{rank}.json").write_text(json.dumps(self.batches))
        if rank == 0:
            torch.save(module.model.state_dict(), self.out / "final.pt")
            (self.out / "normalization.txt").write_text(str(trainer.datamodule.normalization))


def step(
    data: str,
    model_dir: str,
    out: str,
    scope: str,
    max_seq_len: int,
    budget: int = 0,
    collate: str = "packed",
    processor: str = "",
) -> None:
    out_dir = Path(out)
    torch.manual_seed(0)
    module = SGDCausalLM(model_dir, attention="sdpa")
    torch.save(module.model.state_dict(), out_dir / "init.pt")
    dm = BCLDataModule(
        data,
        plan={"pack_size": 2, "window": 2, "scope": scope}
        | ({"contract": "tokens", "max_tokens": budget} if budget else {}),
        batch={
            "collate": collate,
            "labels": "unshifted",
            "max_seq_len": max_seq_len or None,
            "processor": processor or None,
        },
        seed=3,
    )
    trainer = cpu_trainer(
        devices=2,
        strategy="ddp_fork",
        accumulate_grad_batches=2,
        max_steps=1,
        callbacks=[Record(out_dir)],
    )
    trainer.fit(module, dm)


def main(runs: str) -> None:
    for run in json.loads(runs):
        step(**run)
        os.environ.pop("MASTER_PORT", None)  # the next fit finds a free port of its own


if __name__ == "__main__":
    main(sys.argv[1])
