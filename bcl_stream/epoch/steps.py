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

from bcl_stream.epoch.plan import PlanData, ReaderConfig, costs_and_table
from bcl_stream.epoch.truncation import fed_tokens
from bcl_stream.planner.contracts import contract
from bcl_stream.planner.step_contract import deal_step, recut_step
from bcl_stream.planner.token_contract import EMPTY


@dataclass(frozen=True)
class StepCut:
    """One rank's micro-batches of one step, from the step's packs of its planning group."""

    costs: Any
    """Per-record costs by record id (the planner's: an array or a mixture's view)."""
    layout: str
    deal: bool
    """Deal the group's step among its ranks (scopes node and world, BCL packing)."""
    tokens: Any = None
    max_tokens: int | None = None

    def __call__(
        self, group: npt.NDArray[np.int64], local: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``group`` (P, g, B) record ids, ``local`` the rank's place in it -> (the rank's
        g*B record ids, micro-batch sizes), the ids in micro-batch order."""
        mine = group[local].ravel()
        if self.deal and group.shape[0] > 1:
            mine = deal_step(group, self.costs)[local]
        tok = None if self.tokens is None else np.asarray(self.tokens[mine])
        costs = np.asarray(self.costs[mine], dtype=np.float64)
        positions, sizes = recut_step(costs, group.shape[1], self.layout, tok, self.max_tokens)
        return mine[positions], sizes


def step_cut(index: PlanData, config: ReaderConfig) -> StepCut | None:
    """The re-cut a reader applies under ``config``: None under the ``pack`` contract and
    under ``packed`` (whose planner packs already keep the step contract best)."""
    plan = config.plan
    if not contract(plan.contract).recut_steps or plan.layout == "packed":
        return None
    costs, _ = costs_and_table(index, config)
    tokens = None if plan.max_tokens is None else fed_tokens(index, config.max_seq_len)
    deal = config.packing == "bcl" and plan.scope != "rank"
    return StepCut(costs, plan.layout, deal, tokens, plan.max_tokens)


def whole_steps(
    batches: Iterator[tuple[int, npt.NDArray[np.int64]]], grad_accum: int
) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
    """The plan's (first pack, packs (P, n, B)) batches regrouped so each holds whole steps
    (the last one of the epoch may be short). The first batch starts at a step boundary.
    Batches of different widths (the tokens contract's micro-batches padded with ``EMPTY``)
    are joined at the widest."""
    held: npt.NDArray[np.int64] | None = None
    held_first = 0
    for first, packs in batches:
        if held is not None:
            packs = np.concatenate(widened([held, packs]), axis=1)
            first = held_first
        n = packs.shape[1]
        cut = n - n % grad_accum
        if cut:
            yield first, packs[:, :cut]
        held, held_first = (packs[:, cut:], first + cut) if cut < n else (None, 0)
    if held is not None:
        yield held_first, held


def widened(parts: list[npt.NDArray[np.int64]]) -> list[npt.NDArray[np.int64]]:
    """``parts`` padded on the last axis to the widest with ``EMPTY`` (-1, the tokens
    contract's padding past a micro-batch's records), so they can be joined; parts of one
    width (the record contracts') come back as they are."""
    width = max((p.shape[-1] for p in parts), default=0)
    pad = [(0, 0)] * (parts[0].ndim - 1) if parts else []
    return [
        p
        if p.shape[-1] == width
        else np.pad(p, [*pad, (0, width - p.shape[-1])], constant_values=EMPTY)
        for p in parts
    ]
