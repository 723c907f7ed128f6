"""The statistics behind ``tools/bench_measured.py``: intervals, held-out R^2, overhead fit.

Why a module of its own: a measured figure on a shared 2-core machine is only worth the noise
it resolves, so the code that says how much noise there is must be checked on its own, on
planted timings with a known answer (``tests/unit/test_measured_stats.py``), not only trusted
inside a benchmark run. Numpy only; the least squares and R^2 are the cost model's own
(``bcl_stream.cost``), so the overhead fit and the calibration cannot drift apart.

Three sources of spread, each reported separately:

- **Which steps** (sampling): the efficiency of an epoch is a ratio of sums over its steps;
  :func:`bootstrap_steps` resamples the steps (with replacement, ``n_boot`` times) and gives a
  percentile interval for every strategy's efficiency and every pairwise speedup. Strategies
  with the same number of steps are resampled *paired* (the same step indices for both: step t
  of every strategy covers the same stretch of the epoch order, so the long records that land
  there hit both alike); others independently.
- **Timing noise** (between rounds): every pack is timed once per round, rounds interleave all
  strategies in a fresh random order; :func:`per_round` scores each round alone, so the spread
  between rounds is the run-to-run spread of the same plans on this machine.
- **Model error** (fidelity): :func:`holdout_r2` fits c(L) = a*L + b*L^2 + k on the packs of
  some steps and scores the packs of the others.

:func:`fit_overhead` adds a fixed price per micro-batch to the per-record model and regresses
measured pack times on (sum L, sum L^2, records, 1): the constant is what a contract that cuts
an epoch into more micro-batches pays for each extra one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import nonnegative_lstsq, pack_features, r2_score

Matrix = npt.NDArray[np.float64]
"""(ranks, steps) measured seconds of every rank's pack at every step (0 where a rank has none)."""


def efficiency(matrix: Matrix) -> float:
    """docs/metrics.md: sum_t mean_r C / sum_t max_r C (ranks padded with 0 where bins are missing)."""
    return float(matrix.mean(axis=0).sum() / matrix.max(axis=0).sum())


def as_matrix(per_rank: Sequence[Sequence[float]]) -> Matrix:
    """``[rank][step]`` values as a (ranks, steps) matrix, short ranks padded with 0."""
    steps = max(len(r) for r in per_rank)
    out = np.zeros((len(per_rank), steps))
    for r, values in enumerate(per_rank):
        out[r, : len(values)] = values
    return out


def _interval(samples: npt.NDArray[np.float64], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Percentile intervals from resampling steps: ``efficiency[name]`` and
    ``speedup[(a, b)]``, the latter a's speedup over b (b's time / a's time, > 1 when a is
    faster), for every ordered pair of strategies."""

    efficiency: dict[str, tuple[float, float]]
    speedup: dict[tuple[str, str], tuple[float, float]]
    n_boot: int
    level: float


def bootstrap_steps(
    matrices: Mapping[str, Matrix], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> Bootstrap:
    """Intervals for every strategy's efficiency and every pairwise speedup, steps resampled.

    A replicate draws T steps with replacement (T = the strategy's steps; the same draw for every
    strategy with T steps: paired) and scores efficiency = sum mean / sum max on them. A
    speedup is a ratio of epoch times over the same records, i.e. of efficiencies times the
    ratio of the two strategies' total measured work; the replicate keeps the observed work ratio
    and resamples the efficiencies. The work ratio differs from 1 by timing noise and by what
    the packing does to time per token (packs ranging widely in tokens cost more per token on
    a CPU: 10% more for ``verl_kk``'s in the quick runs), so it belongs in the speedup.
    """
    if not matrices:
        raise ValueError("bootstrap_steps needs at least one strategy")
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100 for a percentile interval, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    draws: dict[int, npt.NDArray[np.int64]] = {}
    replicates: dict[str, npt.NDArray[np.float64]] = {}
    for name, matrix in matrices.items():
        if matrix.ndim != 2 or matrix.size == 0 or not matrix.max(axis=0).all():
            raise ValueError(
                f"strategy {name!r}: need a (ranks, steps) matrix with work in every step, got "
                f"shape {matrix.shape}; a plan that left records unplanned is not an epoch"
            )
        steps = matrix.shape[1]
        if steps not in draws:
            draws[steps] = rng.integers(0, steps, size=(n_boot, steps))
        idx = draws[steps]
        means, maxima = matrix.mean(axis=0), matrix.max(axis=0)
        replicates[name] = means[idx].sum(axis=1) / maxima[idx].sum(axis=1)
    work = {name: float(m.sum()) for name, m in matrices.items()}
    speedup: dict[tuple[str, str], tuple[float, float]] = {}
    for a, b in combinations(matrices, 2):
        low, high = _interval(replicates[a] / replicates[b] * (work[b] / work[a]), level)
        speedup[(a, b)] = (low, high)
        speedup[(b, a)] = (1.0 / high, 1.0 / low)
    return Bootstrap(
        {name: _interval(rep, level) for name, rep in replicates.items()}, speedup, n_boot, level
    )


def speedup(a: Matrix, b: Matrix) -> float:
    """b's epoch time over a's (sum over steps of the slowest rank): > 1 when a is faster."""
    return float(b.max(axis=0).sum() / max(float(a.max(axis=0).sum()), 1e-12))


def per_round(matrices: Mapping[str, npt.NDArray[np.float64]]) -> dict[str, Any]:
    """Every strategy's efficiency and every pairwise speedup scored on each timing round alone.

    ``matrices[name]``: (rounds, ranks, steps), round r holding the r-th timing of every pack.
    Returns ``efficiency[name]`` and ``speedup["a/b"]`` (a's speedup over b, every ordered pair)
    as per-round lists, and ``spread``: the
    largest max-min over rounds of any efficiency (what one run alone could be off by)."""
    eff = {n: [efficiency(m[r]) for r in range(m.shape[0])] for n, m in matrices.items()}
    pairs = {
        f"{a}/{b}": [speedup(matrices[a][r], matrices[b][r]) for r in range(matrices[a].shape[0])]
        for a, b in permutations(matrices, 2)
    }
    spread = max((max(v) - min(v) for v in eff.values()), default=0.0)
    return {"efficiency": eff, "speedup": pairs, "spread": float(spread)}


@dataclass(frozen=True, slots=True)
class HeldOut:
    """c(L) = a*L + b*L^2 + k fitted on the training packs, scored on the held-out ones."""

    coef: tuple[float, float, float]
    """a (s/token), b (s/token^2), k (s/record)."""
    r2_train: float
    r2_holdout: float
    n_train: int
    n_holdout: int
    mean_rel_error_holdout: float


def holdout_r2(
    packs: Sequence[npt.ArrayLike], seconds: npt.ArrayLike, train: npt.ArrayLike
) -> HeldOut:
    """Fit the per-record model on the packs where ``train`` is True (non-negative least squares,
    as the calibration does) and score R^2 on the others: how well a cost model fitted on some
    steps predicts the measured times of steps it never saw."""
    y = np.asarray(seconds, dtype=np.float64)
    mask = np.asarray(train, dtype=bool)
    if mask.shape != y.shape or len(packs) != y.size:
        raise ValueError(f"packs ({len(packs)}), seconds {y.shape} and train {mask.shape} differ")
    if mask.sum() < 3 or (~mask).sum() < 2:
        raise ValueError(
            f"need >= 3 training and >= 2 held-out packs, got {int(mask.sum())} and "
            f"{int((~mask).sum())}"
        )
    x = pack_features(packs)
    coef = nonnegative_lstsq(x[mask], y[mask])
    pred = x @ coef
    rel = np.abs(pred[~mask] - y[~mask]) / np.maximum(y[~mask], 1e-12)
    return HeldOut(
        coef=(float(coef[0]), float(coef[1]), float(coef[2])),
        r2_train=r2_score(pred[mask], y[mask]),
        r2_holdout=r2_score(pred[~mask], y[~mask]),
        n_train=int(mask.sum()),
        n_holdout=int((~mask).sum()),
        mean_rel_error_holdout=float(rel.mean()),
    )


@dataclass(frozen=True, slots=True)
class Overhead:
    """Pack time = a*sum L + b*sum L^2 + k*records + c: ``per_micro_batch_s`` is c, with a
    bootstrap interval over packs."""

    per_token_s: float
    per_token_sq_s: float
    per_record_s: float
    per_micro_batch_s: float
    per_micro_batch_ci: tuple[float, float]
    r2: float
    n_packs: int
    record_counts: tuple[int, int]
    """Fewest and most records in a pack: with one count only, k and c cannot be told apart."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_micro_batch_s": self.per_micro_batch_s,
            "per_micro_batch_ci": list(self.per_micro_batch_ci),
            "per_record_s": self.per_record_s,
            "per_token_s": self.per_token_s,
            "per_token_sq_s": self.per_token_sq_s,
            "r2": self.r2,
            "n_packs": self.n_packs,
            "record_counts": list(self.record_counts),
        }


def overhead_features(packs: Sequence[npt.ArrayLike]) -> Matrix:
    """(n_packs, 4): sum L, sum L^2, records and 1 (the micro-batch itself)."""
    x = pack_features(packs)
    return np.column_stack([x, np.ones(len(x))])


def fit_overhead(
    packs: Sequence[npt.ArrayLike],
    seconds: npt.ArrayLike,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Overhead:
    """Regress measured pack times on (sum L, sum L^2, records, 1), all coefficients >= 0, in
    relative terms (each pack's residual over its time: timing noise grows with a pack's time,
    and unweighted, the longest packs' noise would swamp a constant of milliseconds).

    The packs must hold different record counts (else per record and per micro-batch are the
    same column up to a factor): the caller mixes packs of B records with bins of varying counts
    and small probe packs. The interval on the constant resamples packs (with replacement) and
    refits."""
    y = np.asarray(seconds, dtype=np.float64)
    if len(packs) != y.size:
        raise ValueError(f"packs ({len(packs)}) and seconds ({y.size}) differ in length")
    x = overhead_features(packs)
    counts = x[:, 2]
    if y.size < 8 or counts.min() == counts.max():
        raise ValueError(
            f"fitting a per-micro-batch constant needs >= 8 packs of different record counts; "
            f"got {y.size} pack(s) holding {int(counts.min())}-{int(counts.max())} records"
        )
    if np.any(y <= 0):
        raise ValueError("every pack's measured time must be > 0 (relative least squares)")
    xw, yw = x / y[:, None], np.ones_like(y)  # rows scaled by 1/time: relative residuals
    coef = nonnegative_lstsq(xw, yw)
    rng = np.random.default_rng(seed)
    constants = np.empty(n_boot)
    for i in range(n_boot):
        idx = rng.integers(0, y.size, y.size)
        constants[i] = nonnegative_lstsq(xw[idx], yw[idx])[3]
    return Overhead(
        per_token_s=float(coef[0]),
        per_token_sq_s=float(coef[1]),
        per_record_s=float(coef[2]),
        per_micro_batch_s=float(coef[3]),
        per_micro_batch_ci=_interval(constants, level),
        r2=r2_score(x @ coef, y),
        n_packs=int(y.size),
        record_counts=(int(counts.min()), int(counts.max())),
    )
