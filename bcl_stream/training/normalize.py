"""The optimizer step's loss denominator in a plain training loop (torchrun, Accelerate).

A per-token mean over an optimizer step divides the step's summed loss by its trained tokens
over every rank and micro-batch. The batches say which of the three paths the plan took
(``bcl_stream/training/resolve.py``); :func:`step_loss_tokens` follows it:

- ``step_loss_tokens`` on the batch: the count itself, no communication;
- ``rank_step_loss_tokens``: this rank's planned share, summed over the ranks (one scalar);
- neither: the labels' count over the step's micro-batches, summed over the ranks.

A loop that backpropagates ``loss_sum * world_size / step_loss_tokens(...)`` on each
micro-batch, under DDP (which averages gradients over the ranks), steps with the gradient of
the mean over every trained token of the step (``docs/pytorch.md``; a test checks it against
the DataModule on two gloo ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from bcl_stream.epoch.loss_tokens import RANK_STEP_LOSS_TOKENS, STEP_LOSS_TOKENS
from bcl_stream.loading.collate import IGNORE_INDEX


def trained_tokens(batch: Mapping[str, Any], labels: str) -> int:
    """Trained targets of one batch under the label convention (``unshifted``: the model
    shifts, so the first position of each row is no target)."""
    targets = batch["labels"]
    if labels == "unshifted":
        targets = targets[:, 1:]
    return int((targets != IGNORE_INDEX).sum())


def step_loss_tokens(
    micro_batches: Sequence[Mapping[str, Any]],
    labels: str,
    all_reduce: Callable[[torch.Tensor], Any] | None = None,
) -> int:
    """The step's trained tokens over every rank, from the step's ``micro_batches`` (all G
    of them on this rank). ``all_reduce``: sums a tensor over the data-parallel ranks in
    place (default: ``torch.distributed.all_reduce`` where a process group is initialised);
    every rank calls this once per step, as the plan's path is the same on every rank."""
    first = micro_batches[0]
    if STEP_LOSS_TOKENS in first:
        return int(first[STEP_LOSS_TOKENS])
    if RANK_STEP_LOSS_TOKENS in first:
        value = torch.tensor(float(first[RANK_STEP_LOSS_TOKENS]))
    else:
        value = torch.tensor(float(sum(trained_tokens(b, labels) for b in micro_batches)))
    if all_reduce is not None:
        all_reduce(value)
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(value)
    return int(value.item())
