"""Measuring for ``tools/gpu_check.py``: the budget, timing rounds, calibration per layout,
plan sizing and scoring (the metrics of docs/metrics.md on measured and on predicted pack times).

Kept apart from the command so each file stays readable; nothing here is a public API.
Importing this module loads numpy and the planner, cost and simulator modules only; torch comes
with ``gpu_llama``, imported where a pack is built or timed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcl_stream.analysis import metrics, sim
from bcl_stream.analysis.calibrate import CalibrationConfig, design_packs, scaled_r2
from bcl_stream.cost import CostModel, fit_cost_model
from bcl_stream.planner.padded import LAYOUTS, padding_waste

STARTED = time.perf_counter()
PEERS = ("pooled_mffd", "nemo_mffd", "verl_kk", "verl_dynbsz", "hf_rebalance")
RESERVE_S = 8.0  # kept for scoring, plotting and writing after the last timing


class Stop(Exception):
    """The budget ran out or a signal arrived: stop measuring, keep what was measured."""


class Budget:
    """Seconds left of ``total`` since the process started; ``check`` raises :class:`Stop`."""

    def __init__(self, total: float) -> None:
        self.total = total

    def elapsed(self) -> float:
        return time.perf_counter() - STARTED

    def left(self) -> float:
        return self.total - self.elapsed()

    def check(self, what: str) -> None:
        if self.left() < RESERVE_S:
            raise Stop(f"budget of {self.total:.0f} s reached during {what}")


def progress(message: str) -> None:
    print(f"[gpu_check {time.perf_counter() - STARTED:6.1f}s] {message}", flush=True)


@dataclass(slots=True)
class Timings:
    """Seconds per key (one entry per round that reached it), why timing stopped early if it
    did, and the keys whose step raised, with the first line of the error."""

    times: dict[Any, list[float]]
    stopped: str | None = None
    failed: dict[Any, str] = field(default_factory=dict)


def time_rounds(
    keys: list[Any],
    batches: dict[Any, dict[str, Any]],
    step: Any,
    device: Any,
    repeats: int,
    budget: Budget,
    rng: np.random.Generator,
    what: str,
) -> Timings:
    """Time every key ``repeats`` times, each round in a new random order. Stops cleanly on
    the budget or a signal; a pack that raises (out of memory, a kernel that refuses a shape)
    is recorded in ``failed`` and not retried, and the others go on."""
    import gc

    import torch

    from bcl_bench.gpu_llama import time_step

    out = Timings({k: [] for k in keys})
    last = time.perf_counter()
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for i, idx in enumerate(rng.permutation(len(keys))):
                key = keys[idx]
                budget.check(f"{what}, round {r + 1}/{repeats}, pack {i}/{len(keys)}")
                if key in out.failed:
                    continue
                try:
                    out.times[key].append(time_step(step, batches[key], device))
                except RuntimeError as exc:  # torch's OutOfMemoryError is one
                    out.failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                if time.perf_counter() - last > 15:
                    last = time.perf_counter()
                    progress(f"{what}: round {r + 1}/{repeats}, {i + 1}/{len(keys)} packs")
    except Stop as stop:
        out.stopped = str(stop)
    finally:
        gc.enable()
    return out


def warm_up(keys: list[Any], batches: dict[Any, dict[str, Any]], step: Any, n: int) -> None:
    """The heaviest packs first: the allocator reaches its peak once, kernels are loaded."""
    heavy = sorted(keys, key=lambda k: -int(batches[k]["input_ids"].numel()))
    for k in (heavy[:2] + heavy[-2:] + heavy)[:n]:
        step(batches[k])


def calibrate_layout(
    layout: str, ctx: dict[str, Any], cfg: dict[str, Any], budget: Budget
) -> dict[str, Any]:
    """Time designed packs in one layout and fit c(L); see the module docstring (step 3)."""
    from bcl_bench.gpu_llama import make_batch

    lengths, b = ctx["lengths"], cfg["pack_size"]
    design = CalibrationConfig(
        pack_size=b,
        n_packs=cfg["calib_packs"],
        min_tokens=16,
        max_tokens=int(lengths.max()),
        pack_tokens=int(max(b * 16, b * np.percentile(lengths, 90), 2 * lengths.max())),
        seed=cfg["seed"],
    )
    packs = design_packs(design, lengths)
    probe = np.full(b, 16, dtype=np.int64)
    rng = np.random.default_rng(cfg["seed"] + 1)
    vocab, device = ctx["shape"].vocab_size, ctx["device"]
    batches: dict[int | str, Any] = {
        i: make_batch(p.tolist(), layout, vocab, device, rng) for i, p in enumerate(packs)
    }
    batches["overhead"] = make_batch(probe.tolist(), layout, vocab, device, rng)
    warm_up(list(batches), batches, ctx["step"], 4)
    timings = time_rounds(
        list(batches),
        batches,
        ctx["step"],
        device,
        cfg["repeats"],
        budget,
        rng,
        f"calibrate {layout}",
    )
    times = timings.times
    timed = [i for i in range(len(packs)) if times[i]]
    out: dict[str, Any] = {
        "packs_designed": len(packs),
        "packs_timed": len(timed),
        "stopped": timings.stopped,
        "failed": {
            f"{int(packs[k].sum()) if k != 'overhead' else 'overhead'} tokens, pack {k}": why
            for k, why in timings.failed.items()
        },
    }
    if times["overhead"]:
        out["fixed_pack_s"] = float(np.median(times["overhead"]))
        out["fixed_pack_tokens"] = probe.tolist()
    seconds = np.array([np.median(times[i]) for i in timed])
    # A padded pack runs B rows of its longest record: fit it as that.
    effective = [packs[i] if layout == "packed" else np.full(b, packs[i].max()) for i in timed]
    out["packs"] = [{"tokens": packs[i].tolist(), "seconds": times[i]} for i in timed]
    if len(timed) < 8:
        out["fit"] = None
        out["why_no_fit"] = f"only {len(timed)} packs timed; a fit needs 8"
        return out
    fit = fit_cost_model(
        effective, seconds, name=f"{ctx['device'].type}-{layout}", seed=cfg["seed"]
    )
    model = CostModel(
        name=f"gpu_check {layout}",
        a=fit.model.a,
        b=fit.model.b,
        k=fit.model.k,
        unit="seconds",
        source=f"{fit.model.source}; {ctx['model_name']} {layout} B={b} on {ctx['device_name']}",
    )
    out.update(
        fit=model.to_dict(),
        r2_train=fit.r2_train,
        r2_holdout=fit.r2_holdout,
        mean_rel_error_holdout=fit.mean_rel_error_holdout,
        flops_model_r2_scaled=scaled_r2(ctx["flops_model"], effective, seconds),
        per_pack_constant_s=model.k * b,
        attention_equals_linear_at_tokens=(model.a / model.b) if model.b > 0 else None,
    )
    return out


def pack_key(ids: Any) -> tuple[int, ...]:
    return tuple(sorted(int(i) for i in ids))


def choose_steps(
    tokens_all: np.ndarray,
    models: dict[str, CostModel],
    names: list[str],
    cfg: dict[str, Any],
    budget: Budget,
) -> tuple[int, dict[str, dict[str, sim.Schedule]], np.ndarray, float]:
    """The most steps (a multiple of the window and of G, at most ``max_steps``) whose distinct
    packs the calibrated models predict can be timed ``repeats`` times in ~75% of what is left."""
    r, b, w, g = cfg["ranks"], cfg["pack_size"], cfg["window"], cfg["grad_accum"]
    unit = int(np.lcm(w, g))
    candidates = sorted({s for s in range(unit, cfg["max_steps"] + 1, unit)} | {unit}, reverse=True)
    perm = np.random.default_rng(cfg["seed"]).permutation(tokens_all.size)
    chosen = None
    for steps in candidates:
        n = r * b * steps
        if n > tokens_all.size:
            continue
        tokens = tokens_all[perm[:n]]
        plans = {}
        predicted = 0.0
        for layout in LAYOUTS:
            config = sim.SimConfig(
                ranks=r,
                ranks_per_node=r,
                pack_size=b,
                window=w,
                grad_accum=g,
                seed=cfg["seed"],
                layout=layout,
            )
            plans[layout] = sim.schedules(tokens, models[layout], config, tuple(names))
            if layout == "padded":  # BCL under the step contract too (planner/step_contract.py)
                step = dataclasses.replace(config, contract="step")
                bcl = tuple(n for n in names if n.startswith("bcl-"))
                for n, s in sim.schedules(tokens, models[layout], step, bcl).items():
                    plans[layout][f"{n}+step"] = s
            distinct = {
                pack_key(ids): float(s.pack_costs[i, t])
                for s in plans[layout].values()
                for i, rank in enumerate(s.packs)
                for t, ids in enumerate(rank)
            }
            # Plus ~2 ms per timing (event sync, Python) and 15% for launch gaps and warm-up.
            predicted += cfg["repeats"] * (sum(distinct.values()) + 0.002 * len(distinct)) * 1.15
        chosen = (steps, plans, tokens, predicted)
        if predicted < 0.75 * (budget.left() - RESERVE_S):
            break
    if chosen is None:
        raise SystemExit(
            f"gpu_check: the corpus has {tokens_all.size} records, fewer than one window of "
            f"{r * b * unit}; lower --ranks/--pack-size/--window"
        )
    return chosen


def matrix(per_rank: list[list[float]]) -> np.ndarray:
    steps = max((len(x) for x in per_rank), default=0)
    out = np.zeros((len(per_rank), steps))
    for i, values in enumerate(per_rank):
        out[i, : len(values)] = values
    return out


def efficiency(m: np.ndarray) -> float:
    peak = m.max(axis=0).sum()
    return float(m.mean(axis=0).sum() / peak) if peak > 0 else float("nan")


def score(
    layout: str,
    plans: dict[str, sim.Schedule],
    tokens: np.ndarray,
    medians: dict[tuple[str, tuple[int, ...]], float],
) -> dict[str, dict[str, Any]]:
    """Measured and predicted figures per strategy in one layout (docs/metrics.md's definitions)."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in plans.items():
        keys = [[(layout, pack_key(ids)) for ids in rank] for rank in s.packs]
        pred = np.asarray(s.pack_costs, dtype=np.float64)
        lens = [[tokens[np.asarray(ids)] for ids in rank] for rank in s.packs]
        pad_tokens = sum(float(padding_waste(x)) for rank in lens for x in rank)
        real_tokens = sum(int(x.sum()) for rank in lens for x in rank)
        entry: dict[str, Any] = {
            "records": int(sum(len(ids) for rank in s.packs for ids in rank)),
            "steps": int(pred.shape[1]),
            "pack_sizes": sorted({len(ids) for rank in s.packs for ids in rank}),
            "predicted_efficiency": efficiency(pred),
            "imbalance_sq": metrics.imbalance_sq(
                matrix([[float(np.sum(x.astype(np.float64) ** 2)) for x in rank] for rank in lens])
            ),
            "predicted_time_s": float(pred.max(axis=0).sum()),
            "padding_waste_tokens": pad_tokens / (pad_tokens + real_tokens)
            if layout == "padded"
            else 0.0,
        }
        missing = sum(1 for rank in keys for k in rank if k not in medians)
        if missing:
            entry["measured"] = None
            entry["why_not_measured"] = (
                f"{missing} of its packs were not timed (stopped early, or failed: see measurement)"
            )
        else:
            meas = matrix([[medians[k] for k in rank] for rank in keys])
            entry.update(
                measured_efficiency=efficiency(meas),
                measured_time_s=float(meas.max(axis=0).sum()),
                step_times_s=meas.max(axis=0).tolist(),
                pack_rel_error=float(np.mean(np.abs(pred - meas)[meas > 0] / meas[meas > 0])),
            )
        out[name] = entry
    for base in ("sequential", *PEERS):
        if base not in out:
            continue
        for entry in out.values():
            for kind in ("measured", "predicted"):
                mine, theirs = entry.get(f"{kind}_time_s"), out[base].get(f"{kind}_time_s")
                if mine and theirs:
                    entry[f"{kind}_speedup_vs_{base}"] = theirs / mine
    return out
