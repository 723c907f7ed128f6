"""`make demo`: the whole pipeline on a real corpus, end to end, on 2 CPU DDP ranks.

1. Build the standard-library chat corpus (docstring -> prompt, function source -> answer).
2. Preprocess it into costed MDS (cl100k tokens; cost model = the trained TinyGPT's shape).
3. Train TinyGPT with ``python -m lightning_module fit --config configs/cpu_demo.yaml``
   (2 gloo ranks, BCL packs), uninterrupted.
4. Train again but stop at a checkpoint, then resume from it in a NEW process; compare every
   rank's packs (PackLogger logs, exact record ids per step) with the uninterrupted run.
5. Train with ``packing=sequential`` (the plain-loader baseline, same records and order).
6. Report balance: estimated (cost index) and measured (per-rank forward seconds, step wall
   seconds) across ranks, BCL against sequential: a table, ``results/demo/report.json`` and
   ``results/demo/balance.png``.

Every run is a separate ``python -m lightning_module`` process; its output goes to
``results/demo/work/<run>.log`` (shown if the run fails). Measured seconds depend on what
else the machine runs: the report states the machine and counts, never fixed figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from bcl_bench import demos
from bcl_bench.harness import ROOT, machine_stamp, write_result
from bcl_stream.analysis.metrics import metrics_from_costs
from bcl_stream.analysis.plots import plot_step_costs
from bcl_stream.cost import ModelShape, from_shape
from bcl_stream.io.index import read_index
from bcl_stream.preprocess import preprocess

OUT, WORK = demos.demo_dirs("demo")
BASE_CONFIG = ROOT / "configs" / "cpu_demo.yaml"
WARMUP_STEPS = 3  # first steps include lazy initialisation; left out of measured figures


def build_dataset(records: int, model_cfg: dict[str, Any]) -> dict[str, Any]:
    """Corpus -> costed MDS under WORK/mds; returns the preprocessing report."""
    corpus, written = demos.stdlib_corpus(WORK, records)
    shape = ModelShape(
        n_layers=model_cfg["n_layers"],
        d_model=model_cfg["d_model"],
        n_heads=model_cfg["n_heads"],
        n_kv_heads=model_cfg["n_heads"],
        ffn_hidden=model_cfg["ffn_hidden"],
        vocab_size=model_cfg["vocab_size"],
    )
    model = from_shape("cpu-demo-tinygpt", shape, "configs/cpu_demo.yaml model shape")
    report = preprocess(
        [str(corpus)],
        str(WORK / "mds"),
        format="mds",
        cost_model=model,
        max_record_tokens=model_cfg["max_seq_len"],
        outliers="truncate",
        overwrite=True,
        workers=2,
        progress=False,
    )
    out = report.to_dict()
    out["output"] = str((WORK / "mds").relative_to(ROOT))  # no machine paths in the report
    out["inputs"] = [str(corpus.relative_to(ROOT))]
    out["corpus_records"] = written
    return out


def run_config(name: str, base: dict[str, Any], data: dict[str, Any]) -> Path:
    """A copy of cpu_demo.yaml with this run's logs, checkpoints and data options. The run's
    directory starts empty: a checkpoint left by an earlier demo would be resumed instead of
    this run's (Lightning names a second ``step=40.ckpt`` ``step=40-v1.ckpt``)."""
    shutil.rmtree(WORK / name, ignore_errors=True)
    cfg = json.loads(json.dumps(base))
    for cb in cfg["trainer"]["callbacks"]:
        if cb["class_path"].endswith("PackLogger"):
            cb["init_args"] = {"directory": str(WORK / name / "logs"), "fresh": True}
        if cb["class_path"].endswith("ModelCheckpoint"):
            cb["init_args"]["dirpath"] = str(WORK / name / "ckpt")
    cfg["trainer"]["default_root_dir"] = str(WORK / name)
    if "root" in cfg:  # relative to the config file: the copy lives elsewhere
        cfg["root"] = str(ROOT)
    cfg["data"].update(data, data=str(WORK / "mds"))
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def fit(name: str, config: Path, *extra: str) -> float:
    """Run ``name`` in a fresh process (its output in ``WORK/NAME.log``); its wall seconds."""
    return demos.fit(config, WORK / f"{name}.log", *extra)


def read_logs(name: str, world: int) -> list[list[dict[str, Any]]]:
    return demos.rank_logs(WORK / name / "logs", world)


def matrix(logs: list[list[dict[str, Any]]], key: str) -> np.ndarray:
    """(ranks, steps) array of one logged field; ranks must have run the same steps."""
    steps = [[line["step"] for line in rank] for rank in logs]
    if any(s != steps[0] for s in steps):
        raise SystemExit(f"demo: ranks logged different steps: {[len(s) for s in steps]}")
    return np.array([[line[key] for line in rank] for rank in logs], dtype=np.float64)


def audit(logs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Pack counts per rank and records seen twice (must be none within one epoch)."""
    ids = [i for rank in logs for line in rank for i in line["sample_ids"]]
    return {
        "packs_per_rank": [len(rank) for rank in logs],
        "records": len(ids),
        "duplicates": len(ids) - len(set(ids)),
    }


def compare_resume(
    full: list[list[dict[str, Any]]], parts: list[list[list[dict[str, Any]]]]
) -> dict[str, Any]:
    """Resumed (first part + resumed part) == uninterrupted, per rank, step by step."""
    mismatch = None
    compared = 0
    for rank, rank_full in enumerate(full):
        joined = [line for part in parts for line in part[rank]]
        want = [(x["step"], x["sample_ids"]) for x in rank_full]
        got = [(x["step"], x["sample_ids"]) for x in joined]
        compared += len(want)
        if got != want and mismatch is None:
            at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
            mismatch = {"rank": rank, "index": at, "got_len": len(got), "want_len": len(want)}
    return {"identical": mismatch is None, "steps_compared": compared, "first_mismatch": mismatch}


def balance(logs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    est = matrix(logs, "est_cost")
    fwd = matrix(logs, "forward_seconds")[:, WARMUP_STEPS:]
    step = matrix(logs, "step_seconds")[:, WARMUP_STEPS:]
    m_est = metrics_from_costs(est, est.shape[1], 0)
    m_fwd = metrics_from_costs(fwd, fwd.shape[1], 0)
    wall = step.max(axis=0)
    tokens = matrix(logs, "tokens")[:, WARMUP_STEPS:]
    return {
        "estimated": {"efficiency": m_est.efficiency, "cv_ranks": m_est.cv_ranks},
        "measured_forward": {"efficiency": m_fwd.efficiency, "cv_ranks": m_fwd.cv_ranks},
        "measured_step_seconds_mean": float(wall.mean()),
        "measured_step_seconds_total": float(wall.sum()),
        "steps": int(est.shape[1]),
        # The machine's speed during this run: compare runs with it before comparing seconds.
        "forward_ms_per_1k_tokens": float(1e6 * fwd.sum() / tokens.sum()),
        "_matrices": (est, fwd),
    }


def replay(
    runs: dict[str, list[list[dict[str, Any]]]], model_cfg: dict[str, Any], steps: int
) -> dict[str, Any]:
    """Time every logged pack's forward+backward in this one process, strategies interleaved
    step by step (which goes first alternates), so both see the same machine load; the DDP
    runs ran minutes apart on a shared machine. Record lengths come from the cost index;
    token values do not change compute. Output: per strategy, C[r, t] in seconds."""
    import torch

    from bcl_stream.loading.collate import collate_packed
    from lightning_module.tinygpt import TinyGPT, TinyGPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokens = read_index(WORK / "mds").tokens
    model = TinyGPT(TinyGPTConfig(**model_cfg))

    def seconds(ids: list[int]) -> float:
        pack = [{"input_ids": np.zeros(int(tokens[i]), np.uint32), "sample_id": i} for i in ids]
        batch = collate_packed(pack, model_cfg["max_seq_len"])
        start = time.perf_counter()
        model.loss(batch).backward()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed

    names = list(runs)
    n = min(steps, *(len(logs[0]) for logs in runs.values()))
    times = {name: np.zeros((len(runs[name]), n)) for name in names}
    seconds(runs[names[0]][0][0]["sample_ids"])  # warm-up
    for t in tqdm(range(n), desc="replay", unit="step", leave=False):
        for name in names if t % 2 == 0 else names[::-1]:
            for r, logs in enumerate(runs[name]):
                times[name][r, t] = seconds(logs[t]["sample_ids"])
    out: dict[str, Any] = {"steps": n}
    for name, c in times.items():
        m = metrics_from_costs(c, c.shape[1], 0)
        out[name] = {"efficiency": m.efficiency, "time_seconds": m.time, "_matrix": c}
    if len(names) == 2:
        out["speedup"] = out[names[1]]["time_seconds"] / out[names[0]]["time_seconds"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1600, help="stdlib records to use")
    parser.add_argument("--stop-at", type=int, default=40, help="step of the interrupted run")
    parser.add_argument("--replay-steps", type=int, default=100, help="steps timed in replay")
    args = parser.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(BASE_CONFIG.read_text())
    world = int(base["trainer"]["devices"])
    every = {"every_n_train_steps": args.stop_at}
    for cb in base["trainer"]["callbacks"]:
        if cb["class_path"].endswith("ModelCheckpoint"):
            cb["init_args"].update(every, filename="{step}")
    machine = machine_stamp()  # the load the runs start under
    timings: dict[str, float] = {}
    # bcl and sequential back to back: on a shared machine the load drifts between runs.
    stages = ["dataset", "bcl", "sequential", "bcl-first", "bcl-resumed", "replay"]
    bar = tqdm(stages, desc="demo", unit="stage")
    t0 = time.perf_counter()
    for stage in bar:
        bar.set_postfix_str(stage)
        start = time.perf_counter()
        if stage == "dataset":
            dataset = build_dataset(args.records, base["model"]["init_args"]["config"])
        elif stage == "bcl":
            fit(stage, run_config(stage, base, {"packing": "bcl"}))
        elif stage == "bcl-first":
            fit(stage, run_config(stage, base, {}), "--trainer.max_steps", str(args.stop_at))
        elif stage == "bcl-resumed":
            ckpt = WORK / "bcl-first" / "ckpt" / f"step={args.stop_at}.ckpt"
            if not ckpt.is_file():
                raise SystemExit(f"demo: the interrupted run wrote no checkpoint {ckpt}")
            fit(stage, run_config(stage, base, {}), "--ckpt_path", str(ckpt))
        elif stage == "sequential":
            fit(stage, run_config(stage, base, {"packing": "sequential"}))
        else:
            runs = {name: read_logs(name, world) for name in ("bcl", "sequential")}
            replayed = replay(runs, base["model"]["init_args"]["config"], args.replay_steps)
        timings[stage] = time.perf_counter() - start
    bar.close()

    full = read_logs("bcl", world)
    resume = compare_resume(full, [read_logs("bcl-first", world), read_logs("bcl-resumed", world)])
    resume["checkpoint_step"] = args.stop_at
    results = {"bcl": balance(full), "sequential": balance(read_logs("sequential", world))}
    matrices = {}
    for name, res in results.items():
        est, fwd = res.pop("_matrices")
        matrices[f"{name}: estimated cost"] = est
        matrices[f"{name}: measured forward seconds"] = fwd
        matrices[f"{name}: replayed fwd+bwd seconds"] = replayed[name].pop("_matrix")
    png = plot_step_costs(matrices, OUT / "balance.png", max_steps=200)
    report = {
        "resume_identical": bool(resume["identical"]),
        "efficiency": {k: v["estimated"]["efficiency"] for k, v in results.items()},
        "measured_efficiency": {k: v["measured_forward"]["efficiency"] for k, v in results.items()},
        "measured_step_seconds": {k: v["measured_step_seconds_mean"] for k, v in results.items()},
        "measured_replay": replayed,
        "resume": resume,
        "balance": results,
        "audit": {"bcl": audit(full), "sequential": audit(read_logs("sequential", world))},
        "dataset": dataset,
        "config": {
            "base": str(BASE_CONFIG.relative_to(ROOT)),
            "world_size": world,
            "data": base["data"],
            "model": base["model"]["init_args"]["config"],
        },
        "notes": (
            f"efficiency = sum_t mean_r C / sum_t max_r C over (rank, step) pack costs; "
            f"estimated from the cost index, measured from each rank's forward seconds (no "
            f"collective inside forward), first {WARMUP_STEPS} steps left out of measured "
            "figures; measured_step_seconds = mean over steps of the slowest rank's step wall "
            "time (includes the all-reduce wait); runs are minutes apart on a possibly shared "
            "machine, so compare balance.*.forward_ms_per_1k_tokens (same model, so equal on a "
            "quiet machine) before comparing their seconds. measured_replay: every logged pack timed "
            "again (forward+backward, one process, strategies interleaved per step so both see "
            "the same machine load); time_seconds = sum_t max_r, speedup = sequential / bcl."
        ),
        "timings_seconds": {**timings, "total": time.perf_counter() - t0},
    }
    write_result(report, OUT / "report.json", machine=machine)
    print(
        f"\n{'':12}{'est. eff.':>10}{'meas. eff.':>11}{'step s':>9}{'steps':>7}"
        f"{'fwd ms/1k tok (machine speed)':>31}"
    )
    for name, res in results.items():
        print(
            f"{name:12}{res['estimated']['efficiency']:10.3f}"
            f"{res['measured_forward']['efficiency']:11.3f}"
            f"{res['measured_step_seconds_mean']:9.3f}{res['steps']:7d}"
            f"{res['forward_ms_per_1k_tokens']:31.1f}"
        )
    print(
        f"replay ({replayed['steps']} steps, fwd+bwd): efficiency bcl "
        f"{replayed['bcl']['efficiency']:.3f} vs sequential "
        f"{replayed['sequential']['efficiency']:.3f}; speedup {replayed.get('speedup', 0):.3f}"
    )
    print(f"resume identical: {resume['identical']} ({resume['steps_compared']} rank-steps)")
    print(
        f"report: {OUT / 'report.json'}  plot: {png}  total {report['timings_seconds']['total']:.0f} s"
    )
    return 0 if resume["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
