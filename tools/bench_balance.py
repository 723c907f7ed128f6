"""Balance benchmark: how well each planning scope balances real length distributions, what the
planner's knobs buy, and how fast the planner is.

Setting (DESIGN.md): 8 ranks, B=8 records per pack, G=4 micro-batches per step, llama3-8b
training-FLOPs costs, records capped at 8192 tokens; one node (ranks_per_node=8) and two nodes
(ranks_per_node=4, where ``bcl-node`` differs from ``bcl-world``). Corpora: every profile of
tools/corpora.py (65536 records each) plus the stdlib chat corpus (cl100k token counts).
Each number is the mean over (seed, epoch) repetitions; a profile's seed also reseeds its data.

Derived numbers:
- cross-rank CV reduction of X = 1 - cv_ranks(X) / cv_ranks(sequential), per repetition.
- speedup of X over Y = T(Y)/T(X) per unit of cost emitted, i.e. T(Y)/T(X) * used(X)/used(Y);
  it equals DESIGN.md's T(Y)/T(X) whenever both emit the same records (every profile here; the
  stdlib corpus leaves a tail of < R*B*G records, not always the same size per strategy).
- planner throughput: records/s of ``plan_epoch`` (costs and stream order given), best of 3,
  on one core (thread pools limited to 1 below, before numpy is imported, and the process is
  pinned to one CPU where the OS allows).

Writes results/bench_balance.json, results/bench_balance.md (tables for the README) and PNGs
results/bench_balance_*.png. Usage::

    python tools/bench_balance.py            # full (a few minutes on one core)
    python tools/bench_balance.py --quick    # under a minute: fewer records, one repetition
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one core: set before numpy loads its BLAS thread pool
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import argparse
import dataclasses
import functools
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora import PROFILES, Profile, stdlib_lengths
from tqdm import tqdm

from bcl_stream.cost import CostModel, get_preset
from bcl_stream.planner import PlanConfig, epoch_order, plan_epoch
from bcl_stream.sim import (
    Schedule,
    SimConfig,
    metrics_from_costs,
    plan_config,
    plan_costs,
    schedules,
)

RANKS, PACK, ACCUM, MAX_RECORD_TOKENS = 8, 8, 4, 8192
COST_MODEL = "llama3-8b"
WINDOWS = (4, 8, 16, 32, 64)
LAYOUTS = {"1node": 8, "2node": 4}
SCOPES = ("rank", "node", "world")
PAPER_BEST = 0.828
TARGETS = {"cv_reduction_rank_w32": 0.80, "efficiency_world_w16": 0.95, "records_per_s": 2e6}
ABLATION: list[dict[str, Any]] = [
    {"algorithm": a, "refine": r, "pack_order": o}
    for a in ("lpt", "snake")
    for r in (8, 0)
    for o in ("desc", "stream")
]
Lengths = npt.NDArray[np.int64]
HAS_CARRY = "carry" in PlanConfig.__slots__
"""The planner's lookahead carry-over (planner/carry.py); benchmarked on and off when present."""


def _sample(profile: Profile, n: int, seed: int) -> Lengths:
    return profile(n, seed, max_tokens=MAX_RECORD_TOKENS)


def corpora_for(n: int) -> dict[str, Callable[[int], Lengths]]:
    """Name -> (seed -> token counts). The stdlib corpus is fixed data: the seed only reorders."""
    out: dict[str, Callable[[int], Lengths]] = {
        name: functools.partial(_sample, p, n) for name, p in PROFILES.items()
    }
    std = np.minimum(stdlib_lengths("cl100k"), MAX_RECORD_TOKENS)
    out["stdlib"] = lambda seed: std
    return out


def bcl_schedule(
    tok: Lengths, model: CostModel, sim: SimConfig, scope: str, **overrides: Any
) -> Schedule:
    """One BCL plan through the simulator's PlanConfig, with PlanConfig fields overridden;
    ``carry_fraction`` sets ``carry`` to that fraction of the window's W*B records."""
    if "carry_fraction" in overrides:
        overrides["carry"] = int(overrides.pop("carry_fraction") * sim.window * sim.pack_size)
    config = dataclasses.replace(plan_config(sim, scope), **overrides)
    costs = model.cost(tok)
    plan = plan_epoch(costs, epoch_order([tok.size], sim.seed, sim.epoch), config, tok)
    return Schedule(plan_costs(plan, costs), plan.records_used, plan.records_left)


def score(s: Schedule, base: dict[str, Schedule]) -> dict[str, float]:
    """Metrics of one schedule (both sync modes) and its gains over the baselines."""
    out: dict[str, float] = {}
    for sync in ("microbatch", "step"):
        m = metrics_from_costs(
            s.pack_costs, s.records_used, s.records_left, microbatches_per_step=ACCUM, sync=sync
        )
        suffix = "" if sync == "microbatch" else "_step"
        out |= {f"efficiency{suffix}": m.efficiency, f"cv_ranks{suffix}": m.cv_ranks}
        if sync == "microbatch":
            out |= {"cv_time": m.cv_time, "time": m.time, "records_left": m.records_left}
        for name, b in base.items():
            bm = metrics_from_costs(b.pack_costs, 0, 0, microbatches_per_step=ACCUM, sync=sync)
            per_cost = (bm.time / b.pack_costs.sum()) / (m.time / s.pack_costs.sum())
            out[f"speedup_vs_{name}{suffix}"] = per_cost
            if name == "sequential":
                out[f"cv_reduction{suffix}"] = 1.0 - m.cv_ranks / bm.cv_ranks
    return out


def mean_dicts(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}


def run_scopes(
    data: dict[str, Callable[[int], Lengths]], reps: list[tuple[int, int]], model: CostModel
) -> dict[str, Any]:
    """layout -> profile -> strategy -> (window ->) mean scores."""
    out: dict[str, Any] = {}
    jobs = [(layout, name) for layout in LAYOUTS for name in data]
    for layout, name in tqdm(jobs, desc="scopes x windows", unit="profile"):
        acc: dict[str, list[dict[str, float]]] = {}
        for seed, epoch in reps:
            tok = data[name](seed)
            sim = SimConfig(
                ranks=RANKS, ranks_per_node=LAYOUTS[layout], pack_size=PACK, grad_accum=ACCUM,
                seed=seed, epoch=epoch,
            )  # fmt: skip
            base = schedules(tok, model, sim, ("sequential", "pooled_mffd"))
            for key, s in base.items():
                acc.setdefault(key, []).append(score(s, base))
            for w in WINDOWS:
                at_w = dataclasses.replace(sim, window=w)
                for scope in SCOPES:
                    s = bcl_schedule(tok, model, at_w, scope)
                    acc.setdefault(f"bcl-{scope}@{w}", []).append(score(s, base))
                if HAS_CARRY:  # the paper's BCL: a window and nothing beyond it
                    s = bcl_schedule(tok, model, at_w, "rank", carry=0)
                    acc.setdefault(f"bcl-rank-nocarry@{w}", []).append(score(s, base))
        first = data[name](reps[0][0])
        prof: dict[str, Any] = {
            "records": int(first.size),
            "median_tokens": float(np.median(first)),
            "mean_tokens": float(first.mean()),
        }
        for key, rows in acc.items():
            strategy, _, window = key.partition("@")
            target = prof.setdefault(strategy, {})
            if window:
                target[window] = mean_dicts(rows)
            else:
                prof[strategy] = mean_dicts(rows)
        out.setdefault(layout, {})[name] = prof
    return out


def run_ablation(
    data: dict[str, Callable[[int], Lengths]], reps: list[tuple[int, int]], model: CostModel
) -> list[dict[str, Any]]:
    """Partition algorithm x refine x pack order (x carry when the planner has it), one node:
    bcl-rank at W=32 and bcl-world at W=16, per profile, mean over repetitions."""
    variants = list(ABLATION)
    if HAS_CARRY:
        variants += [{**ABLATION[0], "carry_fraction": f} for f in (0.0, 0.125, 0.5)]
    out = []
    for variant in tqdm(variants, desc="ablation", unit="variant"):
        per_profile: dict[str, dict[str, float]] = {}
        for name, make in data.items():
            rows = []
            for seed, epoch in reps:
                tok = make(seed)
                sim = SimConfig(ranks=RANKS, ranks_per_node=8, pack_size=PACK, grad_accum=ACCUM,
                                seed=seed, epoch=epoch)  # fmt: skip
                base = schedules(tok, model, sim, ("sequential",))
                rank8 = score(bcl_schedule(tok, model, dataclasses.replace(sim, window=8),
                                           "rank", **variant), base)  # fmt: skip
                rank = score(bcl_schedule(tok, model, dataclasses.replace(sim, window=32),
                                          "rank", **variant), base)  # fmt: skip
                world = score(bcl_schedule(tok, model, dataclasses.replace(sim, window=16),
                                           "world", **variant), base)  # fmt: skip
                rows.append({"rank_w8_cv_reduction": rank8["cv_reduction"],
                             "rank_w32_cv_reduction": rank["cv_reduction"],
                             "rank_w32_efficiency": rank["efficiency"],
                             "world_w16_efficiency": world["efficiency"]})  # fmt: skip
            per_profile[name] = mean_dicts(rows)
        medians = {k: float(np.median([p[k] for p in per_profile.values()]))
                   for k in next(iter(per_profile.values()))}  # fmt: skip
        out.append({"variant": variant, "median": medians, "profiles": per_profile})
    return out


def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` (wall seconds, process CPU seconds). On a shared machine the wall
    time also counts time the core spent on other processes; the CPU time does not."""
    wall, cpu = [], []
    for _ in range(repeat):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def run_throughput(n: int, repeat: int, quick: bool) -> dict[str, Any]:
    """records/s of plan_epoch against records per window and against world size."""
    tok = PROFILES["sharegpt"](n, 0, max_tokens=MAX_RECORD_TOKENS)
    costs = get_preset(COST_MODEL).cost(tok)
    order = epoch_order([n], 0, 0)
    windows = (1, 4, 16, 64, 256, 512) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    carry_off = {"carry": 0} if HAS_CARRY else None
    grid: list[tuple[str, int, str, int, dict[str, int]]] = [
        ("window", 8, scope, w, {}) for scope in ("rank", "world") for w in windows
    ]
    if carry_off:
        grid += [("window", 8, "rank", w, carry_off) for w in windows]
    worlds = (8, 64, 1024) if quick else (8, 32, 128, 512, 1024)
    grid += [("world", r, scope, 16, {}) for r in worlds for scope in SCOPES]
    rows = []
    for sweep, world, scope, window, extra in tqdm(grid, desc="planner throughput", unit="config"):
        config = PlanConfig(world_size=world, ranks_per_node=8, pack_size=PACK, window=window,
                            scope=scope, **extra)  # fmt: skip
        groups = world // config.group_size
        if n // groups < config.group_size * PACK * window:
            continue  # not one full window per group: nothing to measure
        wall, cpu = best_of(functools.partial(plan_epoch, costs, order, config), repeat)
        rows.append({
            "sweep": sweep, "world_size": world, "scope": scope, "window": window,
            "records_per_window": window * PACK * config.group_size,
            "carry": getattr(config, "carry_records", 0), "wall_seconds": wall,
            "cpu_seconds": cpu, "records_per_s": n / cpu, "records_per_s_wall": n / wall,
        })  # fmt: skip
    _, order_cpu = best_of(lambda: epoch_order([n], 0, 0), repeat)
    return {"records": n, "repeat": repeat, "rows": rows,
            "epoch_order_records_per_s": n / order_cpu}  # fmt: skip


def summarize(scopes: dict[str, Any], throughput: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers against their targets."""
    one = scopes["1node"]
    red = {w: [p["bcl-rank"][str(w)]["cv_reduction"] for p in one.values()] for w in WINDOWS}
    med = {w: float(np.median(v)) for w, v in red.items()}
    beats = [w for w in WINDOWS if med[w] > PAPER_BEST]
    plain = {w: float(np.median([p["bcl-rank-nocarry"][str(w)]["cv_reduction"]
                                 for p in one.values()]))
             for w in WINDOWS} if HAS_CARRY else {}  # fmt: skip
    beats_plain = [w for w in WINDOWS if plain.get(w, 0.0) > PAPER_BEST]
    eff = {name: p["bcl-world"]["16"]["efficiency"] for name, p in one.items()}
    ranked = sorted(eff, key=eff.__getitem__)
    median_profile = ranked[(len(ranked) - 1) // 2]
    rows = throughput["rows"]
    small = [r for r in rows if r["records_per_window"] <= 4096]
    slowest = min(small, key=lambda r: r["records_per_s"]) if small else None
    every = [r["records_per_s"] for r in rows] or [float("nan")]
    return {
        "cv_reduction_rank_median_by_window": {str(w): v for w, v in med.items()},
        "cv_reduction_rank_w32": {"value": med[32], "target": TARGETS["cv_reduction_rank_w32"],
                                  "met": med[32] >= TARGETS["cv_reduction_rank_w32"]},
        "cv_reduction_rank_nocarry_median_by_window": {str(w): v for w, v in plain.items()},
        "paper_best": {"value": PAPER_BEST, "smallest_window_beating": beats[0] if beats else None,
                       "smallest_window_beating_without_carry":
                           beats_plain[0] if beats_plain else None},
        "efficiency_world_w16": {
            "median": float(np.median(list(eff.values()))), "median_profile": median_profile,
            "median_profile_value": eff[median_profile], "min": min(eff.values()),
            "min_profile": ranked[0], "target": TARGETS["efficiency_world_w16"],
            "met": float(np.median(list(eff.values()))) >= TARGETS["efficiency_world_w16"],
        },
        "planner_records_per_s": {
            "min_up_to_4096_per_window": slowest["records_per_s"] if slowest else float("nan"),
            "slowest_config": {k: slowest[k] for k in ("scope", "world_size", "window", "carry")}
            if slowest else None,
            "median": float(np.median(every)),
            "min": min(every), "max": max(every), "target": TARGETS["records_per_s"],
            "configs_meeting_target": sum(v >= TARGETS["records_per_s"] for v in every),
            "configs": len(rows),
            "default_setting": {
                r["scope"]: r["records_per_s"] for r in rows
                if r["sweep"] == "world" and r["world_size"] == RANKS and r["window"] == 16
            },
        },
    }  # fmt: skip


# ----------------------------------------------------------------------------- report


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _yes(met: bool) -> str:
    return "**yes**" if met else "**no**"


def _median_row(profiles: dict[str, Any], strategy: str, w: str | None) -> dict[str, float]:
    rows = [p[strategy][w] if w else p[strategy] for p in profiles.values()]
    return {key: float(np.median([r[key] for r in rows])) for key in rows[0]}


def markdown(result: dict[str, Any]) -> str:
    """README-ready tables of the results."""
    s, one, two = result["summary"], result["scopes"]["1node"], result["scopes"]["2node"]
    n_corpora, meta = len(one), result["meta"]
    out = [
        "# Balance benchmark\n",
        f"`{meta['command']}` at commit `{meta['commit'][:10]}`"
        f"{' (planner had uncommitted changes)' if meta['planner_uncommitted_changes'] else ''}, "
        f"{meta['utc']}. 8 ranks, B=8, G=4, llama3-8b FLOPs costs, records capped at 8192 "
        f"tokens, {result['records_per_profile']} records per profile, {n_corpora} corpora, "
        f"mean over {len(result['repetitions'])} (seed, epoch) repetitions.\n",
        "## Targets\n",
    ]
    cv, eff, tp = s["cv_reduction_rank_w32"], s["efficiency_world_w16"], s["planner_records_per_s"]
    beat = s["paper_best"]["smallest_window_beating"]
    out.append(_table(["target", "measured", "goal", "met"], [
        ["bcl-rank cross-rank CV reduction vs sequential, W=32, median over corpora",
         f"{cv['value']:.1%}", f">= {cv['target']:.0%}", _yes(cv["met"])],
        ["smallest W whose median CV reduction beats the paper's best (82.8%)",
         f"W={beat}" if beat else "none up to W=64", "-", "-"],
        *([["bcl-rank with carry off (a window and nothing beyond: the paper's BCL), W=32",
            f"{s['cv_reduction_rank_nocarry_median_by_window']['32']:.1%}", ">= 80%",
            _yes(s["cv_reduction_rank_nocarry_median_by_window"]["32"] >= 0.8)],
           ["... smallest W beating 82.8% with carry off",
            f"W={nc}" if (nc := s["paper_best"]["smallest_window_beating_without_carry"])
            else "none up to W=64", "-", "-"]] if HAS_CARRY else []),
        [f"bcl-world balance efficiency, W=16, median corpus ({eff['median_profile']})",
         f"{eff['median']:.3f}", f">= {eff['target']}", _yes(eff["met"])],
        [f"bcl-world balance efficiency, W=16, worst corpus ({eff['min_profile']})",
         f"{eff['min']:.3f}", "-", "-"],
        ["planner records/s (one core) at the benchmark setting (8 ranks, W=16): "
         + " / ".join(tp["default_setting"]),
         " / ".join(f"{v / 1e6:.2f}M" for v in tp["default_setting"].values()), ">= 2M",
         _yes(min(tp["default_setting"].values(), default=0) >= tp["target"])],
        ["planner records/s, slowest configuration with <= 4096 records per window ("
         + ", ".join(f"{k} {v}" for k, v in (tp["slowest_config"] or {}).items()) + ")",
         f"{tp['min_up_to_4096_per_window'] / 1e6:.2f}M", ">= 2M",
         _yes(tp["min_up_to_4096_per_window"] >= tp["target"])],
        ["planner records/s, median over all measured configurations",
         f"{tp['median'] / 1e6:.2f}M ({tp['configs_meeting_target']}/{tp['configs']} >= 2M)",
         ">= 2M", _yes(tp["median"] >= tp["target"])],
    ]))  # fmt: skip
    out.append("\n## Medians over corpora\n\nE: balance efficiency (per micro-batch; `step`: "
               "the G=4 micro-batches of an optimizer step summed). Speedup: simulated time "
               "per unit of cost, T(baseline)/T(strategy).\n")  # fmt: skip
    picks = [("sequential", one, None, "1 node"), ("pooled_mffd", one, None, "1 node"),
             ("bcl-rank", one, "16", "1 node"), ("bcl-rank", one, "32", "1 node"),
             ("bcl-node", two, "16", "2 nodes"), ("bcl-world", one, "16", "1 node"),
             ("bcl-world", two, "16", "2 nodes")]  # fmt: skip
    rows = []
    for strategy, profiles, at, layout in picks:
        m = _median_row(profiles, strategy, at)
        rows.append([f"{strategy}{f' W={at}' if at else ''}", layout, f"{m['efficiency']:.3f}",
                     f"{m['efficiency_step']:.3f}", f"{m['cv_ranks']:.3f}",
                     f"{m['cv_reduction']:.1%}", f"{m['speedup_vs_sequential']:.3f}",
                     f"{m['speedup_vs_pooled_mffd']:.3f}", f"{m['speedup_vs_sequential_step']:.3f}"])  # fmt: skip
    out.append(_table(["strategy", "layout", "E", "E step", "cv_ranks", "CV reduction",
                       "speedup vs seq", "vs pooled_mffd", "vs seq (step)"], rows))  # fmt: skip
    out.append("\n## Per corpus, one node (8 ranks), W=16\n")
    rows = []
    for name, p in one.items():
        r16, r32, w16 = p["bcl-rank"]["16"], p["bcl-rank"]["32"], p["bcl-world"]["16"]
        rows.append([name, f"{p['median_tokens']:.0f}", f"{p['sequential']['efficiency']:.3f}",
                     f"{p['pooled_mffd']['efficiency']:.3f}", f"{r16['efficiency']:.3f}",
                     f"{r32['cv_reduction']:.1%}", f"{w16['efficiency']:.3f}",
                     f"{p['pooled_mffd']['speedup_vs_sequential']:.2f} / "
                     f"{r16['speedup_vs_sequential']:.2f} / {w16['speedup_vs_sequential']:.2f}",
                     f"{r16['speedup_vs_pooled_mffd']:.2f} / {w16['speedup_vs_pooled_mffd']:.2f}"])  # fmt: skip
    out.append(_table(["corpus", "median tokens", "seq E", "mffd E", "rank E", "rank CV red. W=32",
                       "world E", "speedup vs seq: mffd / rank / world",
                       "vs mffd: rank / world"], rows))  # fmt: skip
    out.append("\n## Per corpus, two nodes (2 x 4 ranks), W=16\n")
    rows = []
    for name, p in two.items():
        r, nd, w = p["bcl-rank"]["16"], p["bcl-node"]["16"], p["bcl-world"]["16"]
        rows.append([name, f"{r['efficiency']:.3f}", f"{nd['efficiency']:.3f}",
                     f"{w['efficiency']:.3f}", f"{nd['speedup_vs_sequential']:.2f} / "
                     f"{w['speedup_vs_sequential']:.2f}", f"{nd['speedup_vs_pooled_mffd']:.2f} / "
                     f"{w['speedup_vs_pooled_mffd']:.2f}"])  # fmt: skip
    out.append(_table(["corpus", "rank E", "node E", "world E", "speedup vs seq: node / world",
                       "vs mffd: node / world"], rows))  # fmt: skip
    out.append("\n## Cross-rank CV reduction against window W (median over corpora)\n")
    rows = []
    for w in WINDOWS:
        red = {name: p["bcl-rank"][str(w)]["cv_reduction"] for name, p in one.items()}
        worst = min(red, key=red.__getitem__)
        plain = (f"{_median_row(one, 'bcl-rank-nocarry', str(w))['cv_reduction']:.1%}"
                 if HAS_CARRY else "-")  # fmt: skip
        rows.append([str(w), f"{np.median(list(red.values())):.1%}", f"{red[worst]:.1%} ({worst})",
                     plain, f"{_median_row(two, 'bcl-node', str(w))['cv_reduction']:.1%}",
                     f"{_median_row(one, 'bcl-world', str(w))['cv_reduction']:.1%}"])  # fmt: skip
    out.append(_table(["W", "bcl-rank", "bcl-rank worst corpus", "bcl-rank carry off",
                       "bcl-node (2 nodes)", "bcl-world"], rows))  # fmt: skip
    out.append("\n## Planner knobs (one node; median over corpora)\n")
    rows = [[v["variant"]["algorithm"], str(v["variant"]["refine"]), v["variant"]["pack_order"],
             f"{v['variant']['carry_fraction']:g} W*B" if "carry_fraction" in v["variant"]
             else "default (W*B/4)" if HAS_CARRY else "-",
             f"{v['median']['rank_w8_cv_reduction']:.1%}",
             f"{v['median']['rank_w32_cv_reduction']:.1%}",
             f"{v['median']['rank_w32_efficiency']:.4f}",
             f"{v['median']['world_w16_efficiency']:.4f}"] for v in result["ablation"]]  # fmt: skip
    out.append(_table(["algorithm", "refine", "pack order", "carry", "rank W=8 CV red.",
                       "rank W=32 CV red.",
                       "rank W=32 E", "world W=16 E"], rows))  # fmt: skip
    tp_rows = result["throughput"]["rows"]
    if tp_rows:
        out.append(f"\n## Planner throughput (one core, best of {result['throughput']['repeat']}, "
                   f"{result['throughput']['records']} records)\n")  # fmt: skip
        out.append("records/s from process CPU time (the wall-clock column also counts time the "
                   "shared core spent on other processes).\n")  # fmt: skip
        out.append(_table(["sweep", "scope", "ranks", "W", "records / window", "carry",
                           "records/s (CPU)", "records/s (wall)"],
                          [[r["sweep"], r["scope"], str(r["world_size"]), str(r["window"]),
                            str(r["records_per_window"]), str(r["carry"]),
                            f"{r['records_per_s'] / 1e6:.2f}M",
                            f"{r['records_per_s_wall'] / 1e6:.2f}M"] for r in tp_rows]))  # fmt: skip
    return "\n".join(out)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(result: dict[str, Any], out: Path, sample: Lengths, model: CostModel) -> list[Path]:
    """CV reduction against W, speedups per corpus, throughput, and one corpus's step costs."""
    from bcl_stream.plots import plot_step_costs

    plt = _pyplot()
    one, two = result["scopes"]["1node"], result["scopes"]["2node"]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in one.values():
        ax.plot(WINDOWS, [p["bcl-rank"][str(w)]["cv_reduction"] for w in WINDOWS],
                color="0.75", lw=0.8)  # fmt: skip
    curves = [("bcl-rank", one, "bcl-rank (median)"),
              ("bcl-node", two, "bcl-node, 2 nodes (median)"),
              ("bcl-world", one, "bcl-world (median)")]  # fmt: skip
    if HAS_CARRY:
        curves.insert(1, ("bcl-rank-nocarry", one, "bcl-rank, carry off (median)"))
    for strategy, profiles, label in curves:
        ax.plot(WINDOWS, [_median_row(profiles, strategy, str(w))["cv_reduction"]
                          for w in WINDOWS], marker="o", lw=2, label=label)  # fmt: skip
    ax.axhline(PAPER_BEST, color="red", ls="--", lw=1, label="paper's best (82.8%)")
    ax.axhline(TARGETS["cv_reduction_rank_w32"], color="black", ls=":", lw=1, label="target 80%")
    ax.set_xscale("log", base=2)
    ax.set_xticks(WINDOWS, [str(w) for w in WINDOWS])
    ax.set_xlabel("window W (packs per rank)")
    ax.set_ylabel("cross-rank CV reduction vs sequential")
    ax.set_title("bcl-rank per corpus (grey) and medians, 8 ranks, B=8", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    paths.append(_save(fig, plt, out / "bench_balance_cv_vs_window.png"))

    names = list(one)
    bars = [("pooled_mffd", one, None), ("bcl-rank W=16", one, "16"),
            ("bcl-node W=16 (2 nodes)", two, "16"), ("bcl-world W=16", one, "16")]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    height = 0.8 / len(bars)
    for i, (label, profiles, at) in enumerate(bars):
        key = label.split()[0]
        vals = [(profiles[n][key][at] if at else profiles[n][key])["speedup_vs_sequential"]
                for n in names]  # fmt: skip
        ax.barh(np.arange(len(names)) + i * height, vals, height=height, label=label)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names)
    ax.invert_yaxis()
    ax.set_xlabel("simulated speedup over sequential")
    ax.legend(fontsize=8, loc="lower right")
    paths.append(_save(fig, plt, out / "bench_balance_speedup.png"))

    rows = result["throughput"]["rows"]
    if rows:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for scope, carry in [("rank", True), ("rank", False), ("world", True)]:
            sel = [r for r in rows if r["sweep"] == "window" and r["scope"] == scope
                   and (r["carry"] != 0) == carry]  # fmt: skip
            if sel:
                a1.plot([r["records_per_window"] for r in sel], [r["records_per_s"] for r in sel],
                        marker="o", label=f"scope {scope}{'' if carry else ', carry off'}")  # fmt: skip
        for scope in SCOPES:
            sel = [r for r in rows if r["sweep"] == "world" and r["scope"] == scope]
            a2.plot([r["world_size"] for r in sel], [r["records_per_s"] for r in sel],
                    marker="o", label=f"scope {scope}")  # fmt: skip
        for ax, xlabel in [(a1, "records per window (8 ranks)"), (a2, "ranks (W=16, B=8)")]:
            ax.axhline(TARGETS["records_per_s"], color="red", ls="--", lw=1, label="2M/s target")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("plan_epoch records/s (one core)")
            ax.legend(fontsize=8)
        paths.append(_save(fig, plt, out / "bench_balance_throughput.png"))

    sim = SimConfig(ranks=RANKS, ranks_per_node=8, pack_size=PACK, grad_accum=ACCUM, window=16)
    planned = schedules(sample, model, sim)
    paths.append(plot_step_costs({k: s.pack_costs for k, s in planned.items()},
                                 out / "bench_balance_steps_sharegpt.png"))  # fmt: skip
    return paths


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def headline(result: dict[str, Any]) -> str:
    s = result["summary"]
    cv, eff, tp = s["cv_reduction_rank_w32"], s["efficiency_world_w16"], s["planner_records_per_s"]
    return (
        f"bcl-rank CV reduction W=32 (median): {cv['value']:.1%} (target 80%: "
        f"{'met' if cv['met'] else 'MISSED'}); smallest W beating 82.8%: "
        f"{s['paper_best']['smallest_window_beating']}\n"
        f"bcl-world efficiency W=16 (median corpus {eff['median_profile']}): {eff['median']:.3f} "
        f"(target 0.95: {'met' if eff['met'] else 'MISSED'}); worst {eff['min']:.3f} "
        f"({eff['min_profile']})\n"
        "planner at 8 ranks, W=16: "
        + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in tp["default_setting"].items())
        + f" rec/s; slowest <=4096/window {tp['min_up_to_4096_per_window'] / 1e6:.2f}M rec/s, "
        f"median {tp['median'] / 1e6:.2f}M rec/s, {tp['configs_meeting_target']}/{tp['configs']} "
        f"configurations >= 2M"
    )


def provenance(argv: list[str], quick: bool) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    return {
        "command": " ".join(["python tools/bench_balance.py", *argv]),
        "quick": quick,
        "commit": git("rev-parse", "HEAD"),
        "planner_uncommitted_changes": bool(git("status", "--porcelain", "bcl_stream/planner")),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "setting": {"ranks": RANKS, "pack_size": PACK, "grad_accum": ACCUM,
                    "max_record_tokens": MAX_RECORD_TOKENS, "cost_model": COST_MODEL,
                    "layouts_ranks_per_node": LAYOUTS, "windows": WINDOWS},
    }  # fmt: skip


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits: the JSON stays diffable and small."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and repetitions")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output directory")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    n = 16384 if args.quick else 65536
    reps = [(0, 0)] if args.quick else [(0, 0), (0, 1), (1, 0)]
    model = get_preset(COST_MODEL)
    data = corpora_for(n)
    scopes = run_scopes(data, reps, model)
    ablation = run_ablation(data, reps[:1] if args.quick else reps[:2], model)
    if args.skip_throughput:
        throughput: dict[str, Any] = {"records": 0, "repeat": 0, "rows": []}
    else:
        throughput = run_throughput(1 << (18 if args.quick else 20), 1 if args.quick else 3,
                                    args.quick)  # fmt: skip
    result = {
        "meta": provenance(sys.argv[1:] if argv is None else argv, args.quick),
        "records_per_profile": n,
        "repetitions": reps,
        "summary": summarize(scopes, throughput),
        "scopes": scopes,
        "ablation": ablation,
        "throughput": throughput,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_balance.json").write_text(json.dumps(_rounded(result), indent=1) + "\n")
    (args.out / "bench_balance.md").write_text(markdown(result))
    plots(result, args.out, data["sharegpt"](0), model)
    print(headline(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
