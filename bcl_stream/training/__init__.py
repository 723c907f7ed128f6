"""What every trainer gets: the knobs, the trainer's context, and the resolve step that turns
them and the cost index into what the readers and the collate follow (truncation, planning
costs, the loss normalization path, the label convention). ``BCLDataModule`` and a plain
PyTorch or Hugging Face loop call the same :func:`open_training` (docs/pytorch.md,
docs/hf_trainer.md).

Also the surface a trainer adapter builds on (``lightning_module`` imports these from here,
not from the modules that define them, so they can move): the batch keys of the loss
normalization, the label conventions and the packings, and the checks and phrases of the
set-up line.
"""

from __future__ import annotations

from bcl_stream.epoch.checks import require_packs
from bcl_stream.epoch.cursor import MIXTURE_CHANGES
from bcl_stream.epoch.eval_plan import EVAL_PACKINGS
from bcl_stream.epoch.loss_tokens import RANK_STEP_LOSS_TOKENS, STEP_LOSS_TOKENS
from bcl_stream.epoch.plan import PACKINGS
from bcl_stream.loading.collate import IGNORE_INDEX, LABELS
from bcl_stream.planner.config import LAYOUT_FIELDS
from bcl_stream.training.context import TrainingContext
from bcl_stream.training.knobs import BatchOptions, TrainingKnobs
from bcl_stream.training.normalize import step_loss_tokens, trained_tokens
from bcl_stream.training.resolve import (
    Collate,
    ResolvedTraining,
    Training,
    fed_max_seq_len,
    open_training,
    reader_config,
    resolve,
)

__all__ = [
    "EVAL_PACKINGS",
    "IGNORE_INDEX",
    "LABELS",
    "LAYOUT_FIELDS",
    "MIXTURE_CHANGES",
    "PACKINGS",
    "RANK_STEP_LOSS_TOKENS",
    "STEP_LOSS_TOKENS",
    "BatchOptions",
    "Collate",
    "ResolvedTraining",
    "Training",
    "TrainingContext",
    "TrainingKnobs",
    "fed_max_seq_len",
    "open_training",
    "reader_config",
    "require_packs",
    "resolve",
    "step_loss_tokens",
    "trained_tokens",
]
