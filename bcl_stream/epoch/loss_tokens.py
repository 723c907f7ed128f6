"""Loss denominators from the plan: the trained-token count of every optimizer step.

A per-token mean over an optimizer step divides by the step's trained tokens over every rank
and micro-batch (Hugging Face gathers that count, NeMo-RL and Megatron all-reduce it). Where
one planning row spans the world (one node in scopes ``node``/``world``, or a single rank),
each reader plans every rank's packs of the step anyway, and the cost index holds every
record's trained count, so the count is known before the step runs, identically on every rank,
without a byte exchanged: readers put it on each record they yield under
:data:`STEP_LOSS_TOKENS` and the collate makes it the batch key of that name.

Elsewhere a reader plans its own row only; planning every row would cost each process the
world's planning (``docs/balance.md``). Its own packs of the step are known, though: readers put
the rank's count under :data:`RANK_STEP_LOSS_TOKENS` and the trainer all-reduces that one
scalar at the step's first micro-batch (``lightning_module.hf_causal_lm``). When ``max_seq_len``
truncates a record whose mask trains only some of its tokens, the count after the cut is in its
spans, which the index does not hold (``truncation.py``), and a guess would be a wrong
denominator: then no count is attached, the trainer backpropagates summed losses and, before
the optimizer step, all-reduces the step's count taken from the labels and rescales the
gradients (``rescale``).

Steps are the trainer's: G consecutive packs of an epoch from pack 0 (Lightning steps the
optimizer after micro-batches G-1, 2G-1, ... and after the epoch's last); the last step of an
epoch may hold fewer. Under the ``step`` contract the re-cut moves records between the
micro-batches and ranks of one step, never between steps, so the count is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.epoch.plan import PlanData, ReaderConfig, Segment
from bcl_stream.epoch.truncation import fed_trained, truncation

STEP_LOSS_TOKENS = "step_loss_tokens"
"""Record and batch key: the step's trained-token count, identical on every rank."""

RANK_STEP_LOSS_TOKENS = "rank_step_loss_tokens"
"""Record and batch key: this rank's share of its step's trained tokens."""
NORMALIZATIONS = ("plan", "all_reduce", "rescale")
"""Where a step's loss denominator comes from: the plan (``step_loss_tokens``), one all-reduce
of the ranks' planned counts (``rank_step_loss_tokens``) at the step's first micro-batch, or one
all-reduce of the counts in the labels before the optimizer step, gradients rescaled."""


@dataclass(frozen=True, slots=True)
class StepTokens:
    """Per-record trained counts (as fed) and the trainer's accumulation."""

    trained: Any
    """Trained tokens by record id (an array, or a mixture's view over its streams')."""
    grad_accum: int
    world: bool = True
    """Totals over every rank of the step (the row spans the world), else the rank's own."""

    @property
    def key(self) -> str:
        """The record key the totals go under."""
        return STEP_LOSS_TOKENS if self.world else RANK_STEP_LOSS_TOKENS

    def count(self, ids: npt.NDArray[np.int64]) -> int:
        """Trained tokens of the records ``ids`` (padding, -1, skipped)."""
        flat = ids.reshape(-1)
        return int(np.asarray(self.trained[flat[flat >= 0]], dtype=np.int64).sum())

    def totals(self, group: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``group`` (P, n, B): the packs of every rank of the world for n consecutive packs
        starting at a step boundary -> (n,) each pack's step total."""
        n = group.shape[1]
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        flat = group.reshape(-1)
        real = flat >= 0  # the tokens contract pads micro-batches with -1
        counts = np.zeros(flat.size, dtype=np.int64)
        counts[real] = np.asarray(self.trained[flat[real]], dtype=np.int64)
        per_pack = counts.reshape(group.shape).sum(axis=(0, 2))
        starts = np.arange(0, n, self.grad_accum)
        per_step = np.add.reduceat(per_pack, starts)
        return np.repeat(per_step, np.diff(np.append(starts, n)))


def normalization(index: PlanData, config: ReaderConfig) -> tuple[str, str]:
    """(one of :data:`NORMALIZATIONS`, why) for training under ``config``: the same on every
    rank."""
    cut = truncation(index, config.max_seq_len)
    if cut.unknown_trained:
        return "rescale", (
            f"{cut.unknown_trained} records longer than max_seq_len={config.max_seq_len} train "
            "part of their tokens: their count after the cut is in their spans, not the index"
        )
    if config.canonical_ranks is not None:
        return "rescale", (
            f"canonical_ranks={config.canonical_ranks}: a physical rank's step is several "
            "canonical ranks' packs, whose counts this reader does not attach"
        )
    if config.plan.n_rows != 1:
        return "all_reduce", (
            f"{config.plan.n_rows} planning rows: each reader plans its own row only"
        )
    return "plan", "one planning row spans the world"


def step_tokens(
    index: PlanData, config: ReaderConfig, segments: tuple[Segment, ...] = ()
) -> StepTokens | None:
    """The step counts a reader attaches (the world's or the rank's), or None (the trainer
    rescales its gradients). After an elastic
    resume in mid-step (a segment not ending on a step boundary) the steps of the new plan do
    not line up with the trainer's, so none are attached for that epoch."""
    how = normalization(index, config)[0]
    if how == "rescale":
        return None
    g = config.plan.grad_accum
    if any(s.packs_consumed % g for s in segments):
        return None
    trained = fed_trained(index, config.max_seq_len)
    return None if trained is None else StepTokens(trained, g, world=how == "plan")
