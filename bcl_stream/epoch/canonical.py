"""Canonical ranks: the same optimizer steps at every data-parallel size (elastic determinism).

With ``ReaderConfig.canonical_ranks=V`` the epoch is planned for V *canonical* ranks
(``ReaderConfig.canonical()``: V ranks, ``canonical_ranks_per_node`` per node), never for the
R physical ranks that run it. A physical node hosts P*k of them (k = V/R; whole
canonical nodes where they fit, ``planner/canonical.py``) and reads their shards only:
locality follows canonical nodes. At each optimizer step the node's packs of that step, G_c
per hosted canonical rank, are dealt to its P ranks as their k*G_c accumulation
micro-batches, heaviest first. So an optimizer step holds the same V*G_c packs, each with the
same records, at every R that divides V; only how they are grouped into micro-batches
changes. A reader plans the canonical rows its node hosts, a step at a time.

Cost: none for the plan (it is a plan for V ranks); the physical micro-batches are groups of
canonical packs, measured against planning for R directly in ``tools/bench_elastic.py``
(``--canonical``) and reported in ``docs/elastic.md``.

Resume: the cursor counts optimizer steps (``epoch/cursor.py``); a state saved at a step
boundary on R ranks resumes on any R' dividing V at the same step. A state saved inside a step
resumes on the same R only (the step's first micro-batches were grouped for R).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from bcl_stream.epoch.plan import (
    EpochPlan,
    PlanData,
    ReaderConfig,
    ReaderPlan,
    costs_and_table,
    reader_plan,
)
from bcl_stream.epoch.steps import whole_steps, widened
from bcl_stream.planner import Plan
from bcl_stream.planner.canonical import deal_step, node_hosts


def hosted_ranks(config: ReaderConfig, rank: int) -> list[int]:
    """The canonical ranks the node of physical ``rank`` hosts (``planner/canonical.py``)."""
    plan = config.plan
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank must be in [0, {plan.world_size}), got {rank}")
    return node_hosts(
        config.canonical_ranks or plan.world_size,
        config.canonical_node_ranks or plan.ranks_per_node,
        plan.world_size,
        plan.ranks_per_node,
        rank // plan.ranks_per_node,
    )


class CanonicalPlan:
    """One epoch of a canonical plan as one physical layout walks it: what :class:`ReaderPlan`
    offers a reader (``n_packs``, ``iter_rank_packs``, ``remainder_counts``), in physical
    micro-batches. ``n_packs`` = the canonical plan's packs per rank times V/R."""

    def __init__(self, index: PlanData, config: ReaderConfig, epoch: int) -> None:
        if config.canonical_ranks is None:
            raise ValueError("CanonicalPlan needs a config with canonical_ranks")
        self.config = config
        self.epoch = epoch
        self.canonical: ReaderPlan = reader_plan(index, config.canonical(), epoch)
        self.consumed = self.canonical.consumed
        self._costs, _ = costs_and_table(index, config)

    @property
    def n_packs(self) -> int:
        """Physical micro-batches per rank this epoch (identical on every rank)."""
        return self.canonical.n_packs * self.config.hosted

    @property
    def n_steps(self) -> int:
        """Optimizer steps of the epoch (the last one may hold fewer micro-batches)."""
        return -(-self.canonical.n_packs // self.config.plan.grad_accum)

    def remainder_counts(self) -> dict[str, int]:
        """Records of the epoch no rank yields, by reason (the canonical plan's)."""
        return self.canonical.remainder_counts()

    def iter_rank_packs(
        self, rank: int, start: int = 0, group: bool = False
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(index of the first micro-batch, packs (n, B)) of physical ``rank`` from micro-batch
        ``start`` on, whole steps at a time (the first one cut at ``start``)."""
        if group:
            raise ValueError("canonical plans are walked rank by rank (no step re-cut)")
        g, k = self.config.plan.grad_accum, self.config.hosted
        per_node = self.config.plan.ranks_per_node
        step0 = start // (g * k)
        balanced = self.config.packing == "bcl"
        batches = self.canonical.iter_ranks_packs(hosted_ranks(self.config, rank), step0 * g)
        place = rank % per_node
        for first, packs in whole_steps(batches, g):
            steps = [
                deal_step(packs[:, s : s + g], self._costs, per_node, balanced)[place]
                for s in range(0, packs.shape[1], g)
            ]
            out = np.concatenate(steps)
            at = first * k
            skip = max(start - at, 0)
            if skip < out.shape[0]:
                yield at + skip, out[skip:]

    def rank_packs(self, rank: int) -> npt.NDArray[np.int64]:
        """(n_packs, pack_size) record ids of physical ``rank``, in micro-batch order (the
        tokens contract: (n_packs, widest), padded with -1)."""
        parts = [packs for _, packs in self.iter_rank_packs(rank)]
        size = self.config.plan.pack_size
        return np.concatenate(widened(parts)) if parts else np.empty((0, size), dtype=np.int64)

    def whole(self) -> EpochPlan:
        """Every physical rank's micro-batches, materialized (``bcl-stream plan``, tests)."""
        canonical = self.canonical.whole()
        packs = np.stack(widened([self.rank_packs(r) for r in range(self.config.plan.world_size)]))
        return EpochPlan(Plan(packs, canonical.plan.remainder), self.epoch, canonical.consumed)

    def step_packs(self, step: int) -> npt.NDArray[np.int64]:
        """(V*G_c', B) the packs of optimizer step ``step``, in canonical order (canonical rank,
        then micro-batch): what the guarantee keeps at every physical size (tests)."""
        g = self.config.plan.grad_accum
        v = self.config.canonical_ranks or 1
        if not 0 <= step < self.n_steps:
            raise ValueError(f"step must be in [0, {self.n_steps}), got {step}")
        batches = self.canonical.iter_ranks_packs(list(range(v)), step * g)
        for _, packs in whole_steps(batches, g):
            return packs[:, :g].reshape(-1, packs.shape[2])
        raise AssertionError("unreachable: the step is inside the epoch")


def canonical_plan(index: PlanData, config: ReaderConfig, epoch: int) -> CanonicalPlan:
    """The plan a reader of a canonical config follows (its canonical plan is in the plan
    cache under an R-free key: every physical size shares it)."""
    return CanonicalPlan(index, config, epoch)


def plan_for(index: PlanData, config: ReaderConfig, epoch: int) -> ReaderPlan | CanonicalPlan:
    """The lazy plan a reader of ``config`` follows: canonical or not."""
    if config.canonical_ranks is None:
        return reader_plan(index, config, epoch)
    return canonical_plan(index, config, epoch)
