"""``PackLogger``: one JSON line per training step per rank, for audits and resume checks.

Why a file per rank and not ``self.log``: the questions it answers are per rank and per
record — "did rank 1 ever see record 17 twice?", "which rank straggled at step 40?", "did the
resumed job run exactly the packs the uninterrupted one would have?" — and metric loggers
reduce across ranks and steps. A line is small (B ids and a few numbers) and written with
one ``write`` + ``flush``, so a killed job leaves every completed step on disk.

Line fields:

- ``step``: optimizer steps completed before this batch (``trainer.global_step``);
- ``epoch``, ``batch_idx``: Lightning's counters for this batch;
- ``rank``: global rank; ``sample_ids``: the pack's global record ids, in pack order;
- ``streams`` (mixtures only): the stream of each record, by its position in the mixture's
  list (``sample_ids`` are then ids inside each record's stream);
- ``tokens``: real (unpadded) tokens in the pack; ``est_cost``: the pack's estimated cost
  under the DataModule's cost model;
- ``loss_tokens``, ``step_loss_tokens``, ``rank_step_loss_tokens`` where the batch has them:
  the trained tokens of the pack, of its optimizer step (docs/sft.md);
- ``step_seconds``: wall time from batch start to batch end on this rank. Under DDP it
  includes waiting for the slowest rank in the gradient all-reduce, so it is about the same
  on every rank: it measures the step, not the rank;
- ``forward_seconds``: wall time from batch start to the start of ``backward``. DDP runs no
  collective there for a model without buffers (TinyGPT; otherwise set the strategy's
  ``broadcast_buffers=False``), so it is this rank's own compute and its spread across ranks
  is the measured imbalance.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any

import lightning.pytorch as pl
import torch

LOG_NAME = "packs_rank{rank}.jsonl"


def _as_list(value: Any) -> list[int]:
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


def _as_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.sum().item())
    return float(value)


class PackLogWriter:
    """Appends the lines to one rank's file; shared by :class:`PackLogger` (Trainer) and
    Fabric loops (``tools/train_fabric.py``), so both write the same format."""

    def __init__(self, directory: str | os.PathLike[str], rank: int, *, fresh: bool = False):
        self.path = Path(directory) / LOG_NAME.format(rank=rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._fh: IO[str] | None = open(self.path, "w" if fresh else "a", encoding="utf-8")  # noqa: SIM115

    def write(
        self,
        *,
        step: int,
        epoch: int,
        batch_idx: int,
        batch: Any,
        step_seconds: float,
        forward_seconds: float,
    ) -> None:
        if self._fh is None:
            raise ValueError(f"{self.path}: the pack log is closed")
        if not isinstance(batch, dict) or "sample_ids" not in batch:
            raise TypeError(
                "the pack log needs dict batches with a 'sample_ids' entry (BCLDataModule's "
                f"collate adds it); got {type(batch).__name__}"
                + (f" with keys {sorted(batch)}" if isinstance(batch, dict) else "")
            )
        line = {
            "step": step,
            "epoch": epoch,
            "batch_idx": batch_idx,
            "rank": self.rank,
            "sample_ids": _as_list(batch["sample_ids"]),
            **({"streams": _as_list(batch["streams"])} if "streams" in batch else {}),
            "tokens": int(_as_float(batch["tokens"])) if "tokens" in batch else None,
            "est_cost": _as_float(batch["est_cost"]) if "est_cost" in batch else None,
            **{  # SFT: what the loss divides by (docs/sft.md)
                key: int(_as_float(batch[key]))
                for key in ("loss_tokens", "step_loss_tokens", "rank_step_loss_tokens")
                if key in batch
            },
            "step_seconds": step_seconds,
            "forward_seconds": forward_seconds,
        }
        self._fh.write(json.dumps(line) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def drop_from(self, step: int) -> int:
        """Remove the lines of steps ``>= step`` (a run resumed at ``step`` writes them
        again); returns how many were removed. The file is replaced in one rename."""
        if self._fh is None:
            raise ValueError(f"{self.path}: the pack log is closed")
        self._fh.close()
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] < step]
        if len(kept) != len(lines):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return len(lines) - len(kept)


class PackLogger(pl.Callback):
    """Write ``{step, rank, sample_ids, tokens, est_cost, step_seconds, ...}`` per batch.

    The batch must be a dict carrying ``sample_ids`` (what ``BCLDataModule``'s collate adds);
    ``tokens`` and ``est_cost`` are taken from the batch when present. Files go to
    ``directory/packs_rank{rank}.jsonl`` and are appended to, so a resumed job continues the
    same file: when training starts, the lines of the steps it will run (``step`` >= the
    restored ``global_step``) are removed first, so a step a killed run logged after its last
    checkpoint appears once, as the resumed run ran it. ``fresh=True`` truncates the file at
    the start of fit instead.
    """

    def __init__(self, directory: str | os.PathLike[str], *, fresh: bool = False) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.fresh = fresh
        self._writer: PackLogWriter | None = None
        self._t0 = 0.0
        self._forward = float("nan")
        self._step = 0

    def path_for(self, rank: int) -> Path:
        """The log file of ``rank``."""
        return self.directory / LOG_NAME.format(rank=rank)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._writer = PackLogWriter(self.directory, trainer.global_rank, fresh=self.fresh)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._writer is not None:  # the restored step is known here, not at setup
            self._writer.drop_from(int(trainer.global_step))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._forward = float("nan")
        self._step = int(trainer.global_step)
        self._t0 = time.perf_counter()

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        self._forward = time.perf_counter() - self._t0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        seconds = time.perf_counter() - self._t0
        if self._writer is not None:
            self._writer.write(
                step=self._step,
                epoch=int(trainer.current_epoch),
                batch_idx=int(batch_idx),
                batch=batch,
                step_seconds=seconds,
                forward_seconds=self._forward,
            )


def read_pack_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All lines of one rank's log, in order (for audits and tests)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
