"""What every trainer gets: the knobs, the trainer's context, and the resolve step that turns
them and the cost index into what the readers and the collate follow (truncation, planning
costs, the loss normalization path, the label convention). ``BCLDataModule`` and a plain
PyTorch or Hugging Face loop call the same :func:`open_training` (docs/pytorch.md,
docs/hf_trainer.md)."""

from __future__ import annotations

from bcl_stream.training.context import TrainingContext
from bcl_stream.training.knobs import BatchOptions, TrainingKnobs
from bcl_stream.training.normalize import step_loss_tokens, trained_tokens
from bcl_stream.training.resolve import (
    ResolvedTraining,
    Training,
    open_training,
    reader_config,
    resolve,
)

__all__ = [
    "BatchOptions",
    "ResolvedTraining",
    "Training",
    "TrainingContext",
    "TrainingKnobs",
    "open_training",
    "reader_config",
    "resolve",
    "step_loss_tokens",
    "trained_tokens",
]
