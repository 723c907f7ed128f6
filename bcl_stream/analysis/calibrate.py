"""Calibrate a cost model by timing a real model's forward+backward on packs.

Why: the FLOPs presets ignore what a given machine does well or badly (small matmuls, kernel
launches, Python per record). Timing packs of varied lengths *and* compositions (one long
record among short ones vs. equal lengths with the same total) separates the linear, the
quadratic and the per-record terms, and a least-squares fit of c(L) = a*L + b*L^2 + k
(``bcl_stream.cost.fit_cost_model``) gives a model in seconds. Token counts are stored with
every dataset, so the fitted JSON is applied at read time (``CostIndex.costs(model)``)
without rewriting shards.

Pack size: every pack holds exactly ``pack_size`` records, like the trainer's packs, so a
fixed per-pack overhead (optimizer bookkeeping, the loss reduction) is spread over the B
records as part of k. Fit with the B you train with.

Timing discipline (the machine may be shared and noisy): torch threads fixed for the run,
warmup steps first, every pack timed ``repeats`` times in a freshly shuffled order per round
(drift hits all packs alike), the median kept, the garbage collector paused while timing.
torch is imported inside functions, so ``import bcl_stream.analysis.calibrate`` stays light.
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel, Fit, fit_cost_model, get_preset
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.vision.cost import TwoTermFit

KINDS = ("equal", "one_long", "mixed", "sampled")
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationConfig:
    """How packs are designed and timed."""

    pack_size: int = 8
    """Records per pack B (use the trainer's)."""
    n_packs: int = 48
    """Packs to time; ``holdout_fraction`` of them are kept out of the fit and scored."""
    min_tokens: int = 16
    """Shortest record."""
    max_tokens: int = 2048
    """Longest record (at most the model's ``max_seq_len``)."""
    pack_tokens: int = 4096
    """Most tokens in one pack: bounds the time of the slowest pack."""
    repeats: int = 3
    """Timings per pack; the median is fitted."""
    warmup: int = 3
    """Untimed steps before timing (allocator, kernels, caches)."""
    threads: int = 1
    """torch intra-op threads during the run (1 is the most stable on a shared machine)."""
    layout: str = "packed"
    """``packed`` (varlen, cost per record) or ``padded`` (B x longest)."""
    clock: str = "cpu"
    """``cpu``: this process's CPU seconds (``time.process_time``), blind to other processes
    on a shared machine and equal to wall time on a dedicated core with ``threads=1``;
    ``wall``: ``time.perf_counter`` (use it with ``threads > 1``: CPU time sums threads)."""
    holdout_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("pack_size", "n_packs", "min_tokens", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens={self.max_tokens} < min_tokens={self.min_tokens}")
        if self.pack_tokens < self.pack_size * self.min_tokens:
            raise ValueError(
                f"pack_tokens={self.pack_tokens} cannot hold {self.pack_size} records of "
                f"min_tokens={self.min_tokens}; raise pack_tokens or lower pack_size"
            )
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {self.clock!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")


def _loguniform(rng: np.random.Generator, low: float, high: float, size: int) -> npt.NDArray:
    return np.exp(rng.uniform(np.log(low), np.log(max(high, low)), size))


def design_packs(
    config: CalibrationConfig, lengths: npt.ArrayLike | None = None
) -> list[npt.NDArray[np.int64]]:
    """Token counts of ``n_packs`` packs of ``pack_size`` records, cycling through compositions:
    ``equal`` (B equal lengths), ``one_long`` (one long record, B-1 short), ``mixed`` (log-uniform
    lengths) and, when a dataset's ``lengths`` are given, ``sampled`` (B records drawn from it).
    Lengths are clipped to [min_tokens, max_tokens] and scaled down to fit ``pack_tokens``."""
    rng = np.random.default_rng(config.seed)
    b, lo, hi, cap = config.pack_size, config.min_tokens, config.max_tokens, config.pack_tokens
    pool = None if lengths is None else np.asarray(lengths, dtype=np.int64)
    if pool is not None and pool.size == 0:
        raise ValueError("lengths is empty: pass a dataset's token counts or None")
    kinds = KINDS if pool is not None else KINDS[:3]
    packs = []
    for i in range(config.n_packs):
        kind = kinds[i % len(kinds)]
        if kind == "equal":
            pack = np.full(b, _loguniform(rng, lo, min(hi, cap / b), 1)[0])
        elif kind == "one_long":
            short = _loguniform(rng, lo, 4 * lo, b - 1)
            longest = min(hi, cap - short.sum())
            pack = np.concatenate([_loguniform(rng, min(longest, cap / 4), longest, 1), short])
        elif kind == "mixed":
            pack = _loguniform(rng, lo, hi, b)
        else:
            assert pool is not None
            pack = pool[rng.integers(0, pool.size, b)].astype(np.float64)
        pack = np.clip(pack, lo, hi)
        if pack.sum() > cap:  # keep the relative composition, fit the token budget
            pack = np.maximum(lo, pack * (cap - b) / pack.sum())
        packs.append(np.clip(np.round(pack), lo, hi).astype(np.int64))
    return packs


def load_factory(spec: str) -> Callable[[], Any]:
    """``"pkg.module:attr"`` -> the callable (a class or a function) that builds the model."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"model {spec!r}: expected 'pkg.module:factory', e.g. 'mypkg.models:build_model'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model {spec!r}: cannot import {module_name!r} ({exc})") from exc
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ValueError(f"model {spec!r}: {module_name!r} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ValueError(f"model {spec!r}: {attr!r} is not callable")
    return factory


def make_step(model: Any) -> Callable[[dict[str, Any]], None]:
    """One training step's compute (forward + backward, no optimizer update) for ``model``:
    anything with ``loss(batch)``, a LightningModule (``training_step``), or a callable
    ``batch -> loss``. The loss must be a scalar tensor that requires grad."""
    import torch

    if isinstance(model, torch.nn.Module):
        model.train()
    if callable(getattr(model, "loss", None)):
        forward = model.loss
    elif callable(getattr(model, "training_step", None)):
        forward = lambda batch: model.training_step(batch, 0)  # noqa: E731
    elif callable(model):
        forward = model
    else:
        raise ValueError(f"cannot time {type(model).__name__}: not a module, nor callable")
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []

    def step(batch: dict[str, Any]) -> None:
        for p in params:
            p.grad = None
        out = forward(batch)
        loss = out["loss"] if isinstance(out, dict) else out
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.requires_grad:
            raise ValueError(
                f"the model's step returned {type(loss).__name__} "
                f"{getattr(loss, 'shape', '')}; calibrate needs a scalar loss tensor with grad"
            )
        loss.backward()

    return step


def time_configured(
    cfg: CalibrationConfig,
    step: Callable[[dict[str, Any]], None],
    batches: Sequence[dict[str, Any]],
    progress: bool,
) -> npt.NDArray[np.float64]:
    """:func:`time_packs` with the run's own repeats, warm-up, seed and clock (the text and the
    image calibrations time their packs alike)."""
    return time_packs(
        step,
        batches,
        repeats=cfg.repeats,
        warmup=cfg.warmup,
        seed=cfg.seed,
        clock=cfg.clock,
        progress=progress,
    )


def time_packs(
    step: Callable[[dict[str, Any]], None],
    batches: Sequence[dict[str, Any]],
    *,
    repeats: int,
    warmup: int,
    seed: int = 0,
    clock: str = "cpu",
    progress: bool = True,
) -> npt.NDArray[np.float64]:
    """(len(batches), repeats) seconds; each round visits the batches in a new random order."""
    now = CLOCKS[clock]
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    heaviest = sorted(range(len(batches)), key=lambda i: -int(batches[i]["input_ids"].numel()))
    for i in (heaviest * (warmup // max(1, len(batches)) + 1))[:warmup]:
        step(batches[i])
    times = np.zeros((len(batches), repeats))
    bar = tqdm(total=len(batches) * repeats, desc="timing packs", disable=not progress)
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for i in rng.permutation(len(batches)):
                start = now()
                step(batches[i])
                times[i, r] = now() - start
                bar.update()
    finally:
        gc.enable()
        bar.close()
    return times


def scaled_r2(model: CostModel, packs: Sequence[npt.ArrayLike], seconds: npt.ArrayLike) -> float:
    """R^2 of ``s * (pack cost)`` against measured seconds, s fitted by least squares: how well
    a model's *shape* (e.g. tokens, a FLOPs preset) explains time, whatever its unit."""
    return scaled_r2_of([model.cost(p).sum() for p in packs], seconds)


def scaled_r2_of(predicted: npt.ArrayLike, seconds: npt.ArrayLike) -> float:
    """R^2 of ``s * predicted`` against measured seconds, s fitted by least squares (the
    predicted cost of each pack, in any unit)."""
    y = np.asarray(seconds, dtype=np.float64)
    pred = np.asarray(predicted, dtype=np.float64)
    scale = float(pred @ y / (pred @ pred))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - scale * pred) ** 2)) / ss_tot if ss_tot > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted model, the evidence behind it, and how the presets compare on the same packs."""

    fit: Fit
    packs: list[npt.NDArray[np.int64]]
    times: npt.NDArray[np.float64]
    """(n_packs, repeats) seconds."""
    preset_r2: dict[str, float]
    settings: dict[str, Any]

    @property
    def seconds(self) -> npt.NDArray[np.float64]:
        """Median seconds per pack (what was fitted)."""
        return np.median(self.times, axis=1)

    def report(self) -> dict[str, Any]:
        """JSON-friendly: fit quality, timing noise, preset comparison, every pack's data."""
        return {
            **fit_report(self.fit, self.preset_r2, self.times, self.settings),
            "packs": [
                {"tokens": p.tolist(), "seconds": s.tolist()}
                for p, s in zip(self.packs, self.times, strict=True)
            ],
        }


def fit_report(
    fit: Fit | TwoTermFit,
    preset_r2: dict[str, float],
    times: npt.NDArray[np.float64],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The report keys every calibration writes (text packs and image packs alike, so one
    reader of the JSON reads both): the fitted model, its R^2 on the packs fitted and held out,
    the held-out mean relative error, the presets' scaled R^2, the timing noise (median over
    packs of the repeats' IQR relative to their median) and the settings. ``fit``: a
    single-term or two-term fit; ``times``: (n_packs, repeats) seconds."""
    spread = (np.percentile(times, 75, axis=1) - np.percentile(times, 25, axis=1)) / np.median(
        times, axis=1
    )
    return {
        "cost_model": fit.model.to_dict(),
        "r2_train": fit.r2_train,
        "r2_holdout": fit.r2_holdout,
        "mean_rel_error_holdout": fit.mean_rel_error_holdout,
        "preset_r2_scaled": preset_r2,
        "timing_rel_iqr_median": float(np.median(spread)),
        "settings": settings,
    }


def calibrate(
    model: str | Callable[[], Any],
    config: CalibrationConfig | None = None,
    *,
    lengths: npt.ArrayLike | None = None,
    name: str = "calibrated",
    presets: Sequence[str] = ("tokens",),
    progress: bool = True,
) -> Calibration:
    """Build the model (``'pkg.module:factory'`` or a factory; required: the core knows no
    model of its own), time designed packs, fit c(L) per record."""
    import torch

    from bcl_stream.loading.collate import collate_packed, collate_padded

    cfg = config or CalibrationConfig()
    factory = load_factory(model) if isinstance(model, str) else model
    label = model if isinstance(model, str) else getattr(model, "__qualname__", repr(model))
    packs = design_packs(cfg, lengths)
    collate = collate_packed if cfg.layout == "packed" else collate_padded
    rng = np.random.default_rng(cfg.seed + 1)
    batches = [
        collate(
            [
                {"input_ids": rng.integers(0, 100_000, n).astype(np.uint32), "sample_id": j}
                for j, n in enumerate(p)
            ]
        )
        for p in packs
    ]
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        torch.manual_seed(cfg.seed)
        step = make_step(factory())
        times = time_configured(cfg, step, batches, progress)
    finally:
        torch.set_num_threads(previous)
    seconds = np.median(times, axis=1)
    fit = fit_cost_model(
        packs, seconds, name=name, holdout_fraction=cfg.holdout_fraction, seed=cfg.seed
    )
    source = f"{fit.model.source}; {label}, {cfg.layout} B={cfg.pack_size}, {cfg.threads} thread(s), {cfg.clock} clock"
    fitted = CostModel(
        name=name, a=fit.model.a, b=fit.model.b, k=fit.model.k, unit="seconds", source=source
    )
    fit = Fit(fitted, fit.r2_train, fit.r2_holdout, fit.mean_rel_error_holdout)
    preset_r2 = {p: scaled_r2(get_preset(p), packs, seconds) for p in presets}
    settings = {"model": label, **asdict(cfg), "torch": torch.__version__}
    return Calibration(fit, packs, times, preset_r2, settings)
