"""Balance simulator: plan an epoch under every strategy and score it with DESIGN.md's metrics.

C[r, t] is the estimated cost of rank r's t-th pack (for ``pooled_mffd``, its t-th bin).
With ``sync="step"`` (gradient accumulation, DDP syncs once per optimizer step) the G
micro-batches of each step are summed first, so t indexes optimizer steps.

- efficiency  E = sum_t mean_r C / sum_t max_r C
- cv_ranks      = mean_t (std_r C / mean_r C)
- cv_time       = mean_r (std_t C / mean_t C)
- time        T = sum_t max_r C (+ overhead per micro-batch); speedup of X over Y = T(Y)/T(X)
- padding_waste = share of the computed cost spent on padding (0 for the ``packed`` layout)

Layout (``SimConfig.layout``, ``planner/padded.py``): a pack costs the sum of its records'
costs when ``packed`` (varlen attention), B times its costliest record when ``padded``. With
``padded``, BCL plans with the ``padded`` partition (similar lengths together, no sum-based
refinement or step fill).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel
from bcl_stream.planner.baselines import pooled_mffd, sequential
from bcl_stream.planner.bcl import Plan, PlanConfig, plan_epoch, validate_costs
from bcl_stream.planner.order import epoch_order
from bcl_stream.planner.padded import Packs, check_layout, ragged_pack_costs

STRATEGIES = ("sequential", "pooled_mffd", "bcl-rank", "bcl-node", "bcl-world")


@dataclass(frozen=True, slots=True)
class Metrics:
    """DESIGN.md's metrics for one strategy on one epoch."""

    efficiency: float
    cv_ranks: float
    cv_time: float
    time: float
    packs_per_rank: int
    records_used: int
    records_left: int
    padding_waste: float = 0.0
    """Share of the computed cost that is padding: 1 - sum of record costs / sum of pack costs."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _safe_ratio(
    num: npt.NDArray[np.float64], den: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def metrics_from_costs(
    pack_costs: npt.NDArray[np.float64],
    records_used: int,
    records_left: int,
    *,
    overhead: float = 0.0,
    microbatches_per_step: int = 1,
    sync: str = "microbatch",
    useful_costs: npt.NDArray[np.float64] | None = None,
) -> Metrics:
    """Score a (ranks, packs) cost matrix. ``overhead`` is added per micro-batch.

    ``useful_costs``: the same packs' summed record costs (no padding), for ``padding_waste``;
    None: no padding (the ``packed`` layout).
    """
    if sync not in ("microbatch", "step"):
        raise ValueError(f"sync must be 'microbatch' or 'step', got {sync!r}")
    computed = float(np.sum(pack_costs))
    waste = 0.0
    if useful_costs is not None and computed > 0:
        waste = max(0.0, 1.0 - float(np.sum(useful_costs)) / computed)
    c = np.asarray(pack_costs, dtype=np.float64) + overhead
    n_packs = c.shape[1]
    if sync == "step":
        steps = n_packs // microbatches_per_step
        c = c[:, : steps * microbatches_per_step]
        c = c.reshape(c.shape[0], steps, microbatches_per_step).sum(axis=2)
    if c.shape[1] == 0:
        return Metrics(
            float("nan"),
            float("nan"),
            float("nan"),
            0.0,
            n_packs,
            records_used,
            records_left,
            waste,
        )
    mean_r, max_r, std_r = c.mean(axis=0), c.max(axis=0), c.std(axis=0)
    mean_t, std_t = c.mean(axis=1), c.std(axis=1)
    return Metrics(
        efficiency=float(mean_r.sum() / max_r.sum()) if max_r.sum() > 0 else 1.0,
        cv_ranks=float(_safe_ratio(std_r, mean_r).mean()),
        cv_time=float(_safe_ratio(std_t, mean_t).mean()),
        time=float(max_r.sum()),
        packs_per_rank=n_packs,
        records_used=records_used,
        records_left=records_left,
        padding_waste=waste,
    )


def plan_costs(
    plan: Plan, costs: npt.NDArray[np.float64], layout: str = "packed"
) -> npt.NDArray[np.float64]:
    """(ranks, packs) matrix of pack costs under ``layout`` (``planner/padded.py``)."""
    return ragged_pack_costs(plan.packs, costs, layout)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One simulated setting (the ``bcl-stream simulate`` flags)."""

    ranks: int = 8
    ranks_per_node: int = 8
    pack_size: int = 8
    window: int = 16
    grad_accum: int = 4
    max_tokens: int | None = None
    """Bin capacity for ``pooled_mffd`` and memory cap for BCL; None: max(longest, B*mean)."""
    sync: str = "microbatch"
    seed: int = 0
    epoch: int = 0
    overhead: float = 0.0
    algorithm: str = "lpt"
    pack_order: str = "desc"
    refine: int = 8
    layout: str = "packed"
    """``packed`` (pack cost = sum of record costs) or ``padded`` (B x the costliest record)."""


def default_capacity(tokens: npt.NDArray[np.integer], pack_size: int) -> int:
    """Bin capacity when none is given: a bin holds what an average pack of B holds, at least
    the longest record (so every record fits)."""
    tok = np.asarray(tokens)
    return int(max(int(tok.max()), int(np.ceil(pack_size * tok.mean()))))


@dataclass(frozen=True, slots=True)
class Schedule:
    """One strategy's epoch: the packs, their (ranks, packs) cost matrix and record accounting."""

    pack_costs: npt.NDArray[np.float64]
    """(ranks, packs) pack costs under ``SimConfig.layout``."""
    records_used: int
    records_left: int
    packs: Packs = ()
    """``packs[r][t]``: sample ids of rank r's t-th micro-batch (a (ranks, packs, B) array for
    exactly-B strategies, lists of variable-size arrays otherwise), to run the real packs.
    Empty only for a schedule built from a cost matrix alone."""
    useful_costs: npt.NDArray[np.float64] | None = None
    """(ranks, packs) summed record costs of the same packs: the difference from
    ``pack_costs`` is the padding (``padded``). None: no padding."""


def schedules(
    tokens: npt.NDArray[np.integer],
    cost_model: CostModel,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
) -> dict[str, Schedule]:
    """Plan one epoch of ``tokens`` (record lengths) under each strategy, on the same order."""
    tok = np.asarray(tokens, dtype=np.int64)
    if tok.ndim != 1 or tok.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tok.shape}")
    if np.any(tok < 0):
        raise ValueError(f"tokens must be >= 0; found {int(tok.min())}")
    costs = validate_costs(cost_model.cost(tok))
    order = epoch_order([tok.size], config.seed, config.epoch)
    layout = check_layout(config.layout)

    def schedule(packs: Packs, used: int, left: int) -> Schedule:
        return Schedule(
            ragged_pack_costs(packs, costs, layout),
            used,
            left,
            packs,
            ragged_pack_costs(packs, costs, "packed"),
        )

    out: dict[str, Schedule] = {}
    for name in strategies:
        if name == "sequential":
            plan = sequential(order, config.ranks, config.pack_size)
            out[name] = schedule(plan.packs, plan.records_used, plan.records_left)
        elif name == "pooled_mffd":
            capacity = config.max_tokens or default_capacity(tok, config.pack_size)
            bins, left = pooled_mffd(
                order, tok, config.ranks, config.pack_size, config.grad_accum, capacity
            )
            used = sum(b.size for rank_bins in bins for b in rank_bins)
            left_count = sum(v.size for v in left.values())
            out[name] = schedule(bins, used, left_count)
        elif name.startswith("bcl-"):
            plan = plan_epoch(costs, order, plan_config(config, name.removeprefix("bcl-")), tok)
            out[name] = schedule(plan.packs, plan.records_used, plan.records_left)
        else:
            raise ValueError(f"unknown strategy {name!r}; choose from {STRATEGIES}")
    return out


def plan_config(config: SimConfig, scope: str) -> PlanConfig:
    """The planner configuration a simulated BCL strategy uses.

    ``padded`` layout: the ``padded`` partition (``planner/padded.py``), without the step fill,
    which balances sums; ``algorithm`` is then ignored.
    """
    padded = check_layout(config.layout) == "padded"
    return PlanConfig(
        world_size=config.ranks,
        ranks_per_node=config.ranks_per_node,
        pack_size=config.pack_size,
        window=config.window,
        scope=scope,
        max_tokens=config.max_tokens,
        algorithm="padded" if padded else config.algorithm,
        refine=config.refine,
        pack_order=config.pack_order,
        step_fill=not padded,
    )


def simulate(
    tokens: npt.NDArray[np.integer],
    cost_model: CostModel,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
) -> dict[str, Metrics]:
    """Plan one epoch under each strategy and score it with DESIGN.md's metrics."""
    return {
        name: metrics_from_costs(
            s.pack_costs,
            s.records_used,
            s.records_left,
            overhead=config.overhead,
            microbatches_per_step=config.grad_accum,
            sync=config.sync,
            useful_costs=s.useful_costs,
        )
        for name, s in schedules(tokens, cost_model, config, strategies).items()
    }
