"""GPU check: calibrate the cost model on the device and time every strategy's real packs.

One command, one device, about 5 minutes on an H200 (``--budget-s``, default 300 s):

    timeout 540 python3 -m tools.gpu_check --out results/gpu
    python3 -m tools.gpu_check --cpu-tiny --out /tmp/gpu   # same code, CPU, < 3 min

from the checkout's root: ``-m`` puts the root on the import path, so the check runs from a
bare copy of the working tree (the device machine's python has no bcl-stream installed).

What it does, in order (a progress line per phase; the JSON is rewritten after every phase,
so a run stopped by the budget, a signal or an error still leaves what it measured):

1. Checks that the planner, cost and simulator modules import without streaming, webdataset,
   boto3 or lightning (the device image has none of the first three).
2. Builds a Llama-3.2-1B-shaped model (``bcl_bench/gpu_llama.py``; random weights, bf16), probes
   the packed layout's attention (varlen flash attention, else one SDPA per record).
3. Calibrates per layout: designed packs (``bcl_stream.analysis.calibrate.design_packs``, lengths drawn
   from the corpus) timed forward+backward; c(L) = a L + b L^2 + k fitted by
   ``bcl_stream.cost.fit_cost_model`` with a held-out R^2. A padded pack is fitted as B
   records of its longest length, so its model predicts B x c(max L). A pack of B records of
   16 tokens gives the fixed per-micro-batch cost directly.
4. Plans R simulated ranks (default 8; 4 with ``--cpu-tiny``) with every strategy the
   simulator has among ``sequential``, ``nemo_mffd`` (else ``pooled_mffd``), ``verl_kk``,
   ``verl_dynbsz``, ``hf_rebalance`` (and, padded, BCL under ``contract="step"`` as ``bcl-*+step``),
   ``bcl-rank``, ``bcl-world`` (``bcl_stream.analysis.sim.schedules``, BCL planning with the model just
   calibrated for that layout) on the same records of the real stdlib corpus
   (``tools/data/stdlib_cl100k_lengths.npy``). The number of steps is the largest that the
   calibrated model predicts will fit in the budget.
5. Times every distinct pack of every strategy in both layouts, ``--repeats`` rounds in a
   fresh random order each (strategies interleaved), medians kept. Step time = the slowest
   rank's measured pack, as a synchronous step waits for it. Measured efficiency and speedups
   are set beside the simulator's predictions.

Writes ``<out>/gpu_check.json`` (``gpu_check_cpu_tiny.json`` with ``--cpu-tiny``) and a PNG of
the same name (needs matplotlib; without it: ``python -m tools.gpu_check --plot FILE.json``
later, on any machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

# Packs of many shapes: expandable segments keep the caching allocator from fragmenting.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

# numpy, the planner, cost and simulator modules, nothing else (checked right below).
from bcl_bench.gpu_measure import (
    STARTED,
    Budget,
    Stop,
    calibrate_layout,
    choose_steps,
    pack_key,
    progress,
    score,
    time_rounds,
    warm_up,
)

HEAVY_MODULES = (
    "streaming",
    "webdataset",
    "boto3",
    "lightning",
    "lightning_module",
    "transformers",
)
IMPORTS_LOADED = [m for m in HEAVY_MODULES if m in sys.modules]

import numpy as np  # noqa: E402

from bcl_bench.harness import RESULTS, ROOT, bench_parser, machine_stamp, write_result  # noqa: E402
from bcl_stream.analysis import sim  # noqa: E402
from bcl_stream.cost import CostModel, from_shape  # noqa: E402
from bcl_stream.planner.padded import LAYOUTS  # noqa: E402

STRATEGY_CHOICES = (
    ("sequential",),
    ("nemo_mffd", "pooled_mffd"),
    ("verl_kk",),
    ("verl_dynbsz",),
    ("hf_rebalance",),
    ("bcl-rank",),
    ("bcl-world",),
)
"""One name per group, the first the simulator has (``nemo_mffd`` replaces ``pooled_mffd``)."""
LENGTHS = ROOT / "tools" / "data" / "stdlib_cl100k_lengths.npy"


MODE_DEFAULTS: dict[str, tuple[int | float, int | float, str]] = {
    "budget_s": (300.0, 150.0, "stop cleanly after this"),
    "pack_size": (8, 4, "B"),
    "window": (8, 4, "W"),
    "grad_accum": (4, 2, "G"),
    "max_steps": (64, 4, "most steps planned"),
    "repeats": (2, 2, "timing rounds"),
    "calib_packs": (32, 16, "calibration packs per layout"),
    "max_len": (8192, 256, "records clipped to this"),
    # 4 simulated ranks on the CPU: every strategy and both layouts still plan and time
    # distinct packs, at half the packs (and half the seconds) of 8.
    "ranks": (8, 4, "simulated ranks"),
}
"""Per-mode settings: (GPU default, ``--cpu-tiny`` default, what it sets), each also a flag
(``--budget-s`` for ``budget_s``) of the default's type; one table, so the run's defaults and
the ``--help`` figures cannot drift apart."""


def add_mode_options(p: argparse.ArgumentParser) -> None:
    """One flag per :data:`MODE_DEFAULTS` row (default None: the mode's default applies)."""
    for name, (gpu, tiny, what) in MODE_DEFAULTS.items():
        figures = f"{gpu:g}" if gpu == tiny else f"{gpu:g}; tiny {tiny:g}"
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=type(gpu),
            default=None,
            help=f"{what} ({figures})",
        )


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Per-mode defaults; explicit flags win."""
    column = 1 if args.cpu_tiny else 0
    chosen = {
        k: row[column] if getattr(args, k) is None else getattr(args, k)
        for k, row in MODE_DEFAULTS.items()
    }
    return {**chosen, "seed": args.seed}


def strategies_to_run(requested: str | None) -> tuple[list[str], list[str]]:
    """(names to run, names asked for but not in ``bcl_stream.analysis.sim.STRATEGIES``)."""
    available = set(sim.STRATEGIES)
    if requested:
        names = [s for s in requested.split(",") if s]
        return [s for s in names if s in available], [s for s in names if s not in available]
    run, missing = [], []
    for group in STRATEGY_CHOICES:
        present = [s for s in group if s in available]
        if present:
            run.append(present[0])
        else:
            missing.append("/".join(group))
    return run, missing


def build(args: argparse.Namespace, cfg: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Device, model, packed-attention backend and corpus: the context every phase uses."""
    import torch

    from bcl_bench.gpu_llama import (
        LLAMA_1B,
        TINY,
        Llama,
        make_step,
        n_params,
        probe_packed_attention,
        probe_padded_kernels,
    )

    if args.cpu_tiny:
        device, dtype, shape, name = torch.device("cpu"), torch.float32, TINY, "tiny llama"
        torch.set_num_threads(1)  # steadier on a shared machine; speed is not the point here
    elif torch.cuda.is_available():
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, LLAMA_1B
        name = "Llama-3.2-1B shape"
    else:
        raise SystemExit("gpu_check: no CUDA device visible; use --cpu-tiny to run on a CPU")
    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    result["environment"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device_name,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
    }
    attention = probe_packed_attention(shape, device, dtype)
    result["attention"] = {
        "packed": attention,
        "padded": "one causal SDPA over (B, max L), no mask",
        "padded_kernels_that_run": probe_padded_kernels(shape, device, dtype),
    }
    progress(f"device {device_name}; packed attention: {attention['backend']} ({attention['why']})")
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Llama(shape, attention["backend"]).to_dtype(dtype)
    flops = from_shape("flops", shape, f"{name} (bcl_bench/gpu_llama.py)")
    result["model"] = {
        "name": name,
        "shape": dataclasses.asdict(shape),
        "parameters": n_params(model),
        "flops_cost_model": flops.to_dict(),
    }
    progress(f"model {name}: {n_params(model) / 1e6:.1f}M parameters, {dtype}")

    path = Path(args.lengths).resolve()
    raw = np.load(path, allow_pickle=False).astype(np.int64)
    lengths = np.minimum(raw, cfg["max_len"])
    result["corpus"] = {
        "lengths_file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "records": int(lengths.size),
        "clipped_to_max_len": int((raw > cfg["max_len"]).sum()),
        "p10_p50_p90_p99_max": [
            *np.percentile(lengths, [10, 50, 90, 99]).round().astype(int).tolist(),
            int(lengths.max()),
        ],
    }
    return {
        "lengths": lengths,
        "shape": shape,
        "device": device,
        "step": make_step(model),
        "device_name": device_name,
        "model_name": name,
        "flops_model": flops,
    }


def calibrate_all(
    ctx: dict[str, Any], cfg: dict[str, Any], budget: Budget, result: dict[str, Any], write: Any
) -> dict[str, CostModel]:
    """A fitted c(L) per layout, or Stop when a layout could not be fitted in time."""
    models: dict[str, CostModel] = {}
    result["calibration"] = {}
    for layout in LAYOUTS:
        budget.check(f"calibration ({layout})")
        cal = calibrate_layout(layout, ctx, cfg, budget)
        result["calibration"][layout] = cal
        write()
        if cal["fit"] is None:
            raise Stop(f"calibration {layout}: {cal['why_no_fit']}")
        model = models[layout] = CostModel.from_dict(cal["fit"])
        progress(
            f"calibrated {layout}: a={model.a:.3e} b={model.b:.3e} k={model.k:.3e} s, held-out "
            f"R^2 {cal['r2_holdout']:.3f}, B x 16-token pack {cal.get('fixed_pack_s', 0) * 1e3:.1f} ms"
        )
        if cal["stopped"]:
            raise Stop(cal["stopped"])
    return models


def measure(
    args: argparse.Namespace,
    ctx: dict[str, Any],
    cfg: dict[str, Any],
    models: dict[str, CostModel],
    budget: Budget,
    result: dict[str, Any],
    write: Any,
) -> None:
    """Plan every strategy in both layouts, time every distinct pack, score."""
    from bcl_bench.gpu_llama import make_batch

    names, missing = strategies_to_run(args.strategies)
    steps, plans, tokens, predicted = choose_steps(ctx["lengths"], models, names, cfg, budget)
    skipped = sorted({n for p in plans.values() for n, s in p.items() if len(s.packs) == 0})
    plans = {lay: {n: s for n, s in p.items() if n not in skipped} for lay, p in plans.items()}
    result["strategies"] = {
        "requested": args.strategies or "default",
        "run": [n for n in names if n not in skipped],
        "missing": missing,
        "skipped_no_packs": skipped,
    }
    result["plan"] = {
        "steps": steps,
        "records": int(tokens.size),
        "predicted_timing_s": predicted,
        "planned_with": "BCL: the cost model calibrated above for each layout",
    }
    progress(
        f"planned {steps} steps x {cfg['ranks']} ranks ({tokens.size} records): {names}; "
        f"missing {missing or 'none'}; predicted timing {predicted:.0f} s"
    )
    write()
    rng = np.random.default_rng(cfg["seed"] + 2)
    batches: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
    for layout, plan in plans.items():
        for s in plan.values():
            for ids in (ids for rank in s.packs for ids in rank):
                key = (layout, pack_key(ids))
                if key not in batches:
                    lengths = tokens[list(key[1])].tolist()
                    vocab = ctx["shape"].vocab_size
                    batches[key] = make_batch(lengths, layout, vocab, ctx["device"], rng)
    keys = list(batches)
    for layout in LAYOUTS:
        warm_up([k for k in keys if k[0] == layout], batches, ctx["step"], 3)
    progress(f"timing {len(keys)} distinct packs x {cfg['repeats']} rounds")
    timings = time_rounds(
        keys, batches, ctx["step"], ctx["device"], cfg["repeats"], budget, rng, "measure"
    )
    stopped = timings.stopped
    medians = {k: float(np.median(v)) for k, v in timings.times.items() if v}
    failed = timings.failed
    result["measurement"] = {
        "distinct_packs": len(keys),
        "packs_timed": len(medians),
        "timings": int(sum(len(v) for v in timings.times.values())),
        "stopped": stopped,
        "failed_packs": len(failed),
        "failed_examples": [
            f"{lay} pack of {len(ids)} records, {int(tokens[list(ids)].sum())} tokens: {why}"
            for (lay, ids), why in list(failed.items())[:5]
        ],
    }
    result["layouts"] = {lay: score(lay, plans[lay], tokens, medians) for lay in LAYOUTS}
    packed_seq = result["layouts"]["packed"].get("sequential", {}).get("measured_time_s")
    for entry in result["layouts"]["padded"].values():
        if packed_seq and entry.get("measured_time_s"):
            entry["measured_speedup_vs_sequential_packed"] = packed_seq / entry["measured_time_s"]
    if stopped:
        raise Stop(stopped)


def run(args: argparse.Namespace, result: dict[str, Any], write: Any) -> None:
    cfg = settings(args)
    budget = Budget(cfg["budget_s"])
    result["config"] = cfg
    result["imports"] = {"checked": list(HEAVY_MODULES), "loaded_by_bcl_stream": IMPORTS_LOADED}
    progress(f"planner, cost and sim imported; heavy modules loaded: {IMPORTS_LOADED or 'none'}")
    ctx = build(args, cfg, result)
    write()
    models = calibrate_all(ctx, cfg, budget, result, write)
    measure(args, ctx, cfg, models, budget, result, write)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Efficiency (measured vs predicted), measured speedup vs sequential, per layout."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = result.get("layouts") or {}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for col, layout in enumerate(LAYOUTS):
        rows = layouts.get(layout, {})
        names = list(rows)
        x = np.arange(len(names))
        meas = [rows[n].get("measured_efficiency", np.nan) for n in names]
        ax = axes[col]
        ax.bar(x - 0.2, meas, 0.4, label="measured")
        ax.bar(x + 0.2, [rows[n]["predicted_efficiency"] for n in names], 0.4, label="predicted")
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{layout} layout: balance efficiency")
        ax.legend(loc="lower left", fontsize=8)
        speed = [rows[n].get("measured_speedup_vs_sequential", np.nan) for n in names]
        guess = [rows[n].get("predicted_speedup_vs_sequential", np.nan) for n in names]
        shift = -0.2 if layout == "packed" else 0.2
        axes[2].bar(x + shift, speed, 0.4, label=f"{layout}, measured")
        axes[2].scatter(x + shift, guess, marker="_", s=300, color="k", zorder=3)
        axes[2].set_xticks(x, names, rotation=30, ha="right")
    axes[2].set_title("speedup vs sequential, same layout (black: predicted)")
    axes[2].legend(fontsize=8)
    env = result.get("environment", {})
    fig.suptitle(
        f"{result.get('model', {}).get('name', '')} on {env.get('device', '?')}, "
        f"{result.get('config', {}).get('ranks', '?')} simulated ranks"
        + ("" if result.get("complete") else " (incomplete run)")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, RESULTS / "gpu", out_help="output directory")
    p.add_argument("--cpu-tiny", action="store_true", help="tiny model on the CPU (CI smoke run)")
    add_mode_options(p)
    p.add_argument("--lengths", default=str(LENGTHS), help="1-D .npy of token counts")
    p.add_argument("--strategies", default=None, help="comma list (default: every one present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, default=None, help="only redraw the PNG of this JSON")
    args = p.parse_args(argv)
    if args.plot is not None:
        drawn = plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        print(drawn or "matplotlib is not installed")
        return 0 if drawn else 1

    out = args.out / ("gpu_check_cpu_tiny.json" if args.cpu_tiny else "gpu_check.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "tool": "tools/gpu_check.py",
        "mode": "cpu-tiny" if args.cpu_tiny else "gpu",
        "argv": sys.argv[1:],
        "complete": False,
        "stopped": None,
    }

    machine = machine_stamp()

    def write() -> None:
        result["elapsed_s"] = time.perf_counter() - STARTED
        write_result(result, out, machine=machine)

    def on_signal(signum: int, _frame: Any) -> None:
        raise Stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        run(args, result, write)
        result["complete"] = True
    except Stop as stop:
        result["stopped"] = str(stop)
        progress(f"stopped early: {stop}; writing what was measured")
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        write()
    png = plot(result, out.with_suffix(".png"))
    result["plot"] = str(png.name) if png else "not drawn: matplotlib is not installed (use --plot)"
    write()
    progress(f"wrote {out}" + (f" and {png}" if png else ""))
    return 0 if result["complete"] else 2


if __name__ == "__main__":
    sys.exit(main())
