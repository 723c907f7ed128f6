"""The ``step`` record contract as readers apply it (``planner/step_contract.py``).

The plan stays packs of exactly B records; under ``contract="step"`` a reader re-cuts each of
its steps (G consecutive packs, the last step of an epoch possibly fewer) into as many
micro-batches of varying size just before it yields them. Micro-batch k of a rank is the k-th
item either way, so ``len()``, the cursor (``packs_consumed`` counts micro-batches) and
resume are those of the plan: a resume in mid-step re-cuts the step and yields from the
micro-batch it stopped at.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.plan.epoch import PlanData, ReaderConfig, _costs_and_table, tokens_of
from bcl_stream.planner.step_contract import recut_step


@dataclass(frozen=True)
class StepCut:
    """Re-cuts one step's packs: (g, B) sample ids -> (positions in the step's row-major
    records, micro-batch sizes), costliest micro-batch first."""

    costs: Any
    """Per-record costs by sample id (the planner's: an array or a mixture's view)."""
    layout: str
    tokens: Any = None
    max_tokens: int | None = None

    def __call__(
        self, packs: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        ids = np.asarray(packs, dtype=np.int64).ravel()
        tok = None if self.tokens is None else np.asarray(self.tokens[ids])
        costs = np.asarray(self.costs[ids], dtype=np.float64)
        return recut_step(costs, packs.shape[0], self.layout, tok, self.max_tokens)


def step_cut(index: PlanData, config: ReaderConfig) -> StepCut | None:
    """The re-cut a reader applies under ``config`` (None under the ``pack`` contract)."""
    plan = config.plan
    if plan.contract != "step":
        return None
    costs, _ = _costs_and_table(index, config)
    tokens = None if plan.max_tokens is None else tokens_of(index)
    return StepCut(costs, plan.layout, tokens, plan.max_tokens)


def whole_steps(
    batches: Iterator[tuple[int, npt.NDArray[np.int64]]], grad_accum: int
) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
    """The plan's (first pack, packs) batches regrouped so each holds whole steps (the last
    one of the epoch may be short). The first batch must start at a step boundary."""
    held: npt.NDArray[np.int64] | None = None
    held_first = 0
    for first, packs in batches:
        if held is not None:
            packs = np.concatenate([held, packs])
            first = held_first
        cut = packs.shape[0] - packs.shape[0] % grad_accum
        if cut:
            yield first, packs[:cut]
        held, held_first = (packs[cut:], first + cut) if cut < packs.shape[0] else (None, 0)
    if held is not None:
        yield held_first, held
