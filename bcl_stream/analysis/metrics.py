"""The balance metrics of docs/metrics.md, from a matrix of pack costs.

C[r, t] is the estimated cost of rank r's t-th pack (for a pooled peer, its t-th micro-batch).
With ``sync="step"`` (gradient accumulation, DDP syncs once per optimizer step) the G
micro-batches of each step are summed first, so t indexes optimizer steps.

- efficiency  E = sum_t mean_r C / sum_t max_r C
- cv_ranks      = mean_t (std_r C / mean_r C)
- cv_time       = mean_r (std_t C / mean_t C)
- time        T = sum_t max_r C (+ overhead per micro-batch); speedup of X over Y = T(Y)/T(X)
- padding_waste = share of the computed cost spent on padding (0 for the ``packed`` layout)
- imbalance_sq  = mean over micro-batches of max_r S / mean_r S, S[r, t] the sum of the squared
  lengths of rank r's t-th micro-batch (torchtitan's figure; the records' own lengths, whatever
  the layout, always per micro-batch)

Numpy only: the GPU check imports it on a machine without the readers' libraries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Metrics:
    """the metrics of docs/metrics.md for one strategy on one epoch."""

    efficiency: float
    cv_ranks: float
    cv_time: float
    time: float
    packs_per_rank: int
    records_used: int
    records_left: int
    padding_waste: float = 0.0
    """Share of the computed cost that is padding: 1 - sum of record costs / sum of pack costs."""
    download_amplification: float = float("nan")
    shard_working_set: int = 0
    imbalance_sq: float = float("nan")
    """torchtitan's imbalance: mean over micro-batches of max/mean across ranks of the sum of
    squared lengths (1.0 = even); NaN without lengths."""
    displacement_steps_mean: float = float("nan")
    """Mean over emitted records of the steps each is emitted away from its stream window
    (``analysis/displacement.py``); NaN for strategies that do not read node streams."""
    displacement_steps_max: float = float("nan")
    """The largest such displacement (bounded by the heavy lane's horizon)."""

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
    step_sizes: npt.NDArray[np.integer] | None = None,
    useful_costs: npt.NDArray[np.float64] | None = None,
) -> Metrics:
    """Score a (ranks, packs) cost matrix. ``overhead`` is added per micro-batch.

    ``step_sizes``: micro-batches in each optimizer step, for ``sync="step"`` when they vary
    (the pooled peers that vary records per micro-batch also vary micro-batches per global
    batch); None: ``microbatches_per_step`` each, a last partial step dropped.
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
        if step_sizes is None:
            steps = n_packs // microbatches_per_step
            c = c[:, : steps * microbatches_per_step]
            c = c.reshape(c.shape[0], steps, microbatches_per_step).sum(axis=2)
        else:
            sizes = np.asarray(step_sizes, dtype=np.int64)
            if np.any(sizes < 1) or int(sizes.sum()) != n_packs:
                raise ValueError(f"step_sizes must be >= 1 and sum to {n_packs}, got {sizes}")
            starts = np.cumsum(sizes) - sizes
            c = np.add.reduceat(c, starts, axis=1) if sizes.size else c[:, :0]
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


def imbalance_sq(squared: npt.NDArray[np.float64]) -> float:
    """torchtitan's figure from a (ranks, micro-batches) matrix of sums of squared lengths:
    mean over micro-batches of max over ranks / mean over ranks (micro-batches with no tokens
    on any rank are skipped)."""
    s = np.asarray(squared, dtype=np.float64)
    mean = s.mean(axis=0) if s.size else s.sum(axis=0)
    live = mean > 0
    return float((s.max(axis=0)[live] / mean[live]).mean()) if live.any() else float("nan")
