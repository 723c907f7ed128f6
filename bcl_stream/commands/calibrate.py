"""``bcl-stream calibrate``: time a model on packs, fit c(L) = a*L + b*L^2 + k, write the JSON.

The JSON is a cost model any reader or the simulator takes wherever a preset name goes
(``--cost-model cost_model.json``); shards are not rewritten, token counts are stored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bcl_stream.analysis.calibrate import CalibrationConfig, calibrate
from bcl_stream.commands.simulate import load_lengths
from bcl_stream.planner.padded import LAYOUTS

DEMO_MODEL = "lightning_module.tinygpt:TinyGPT"
"""The model ``--model`` defaults to: the demo's TinyGPT (the command line's choice; the
library's ``calibrate()`` requires a model)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time a model's forward+backward on packs and fit a cost model in seconds",
    )
    p.add_argument(
        "--model",
        default=DEMO_MODEL,
        help="'pkg.module:factory' returning a LightningModule, a module with loss(batch), "
        f"or a callable batch -> loss (default: the demo model {DEMO_MODEL})",
    )
    p.add_argument("--out", type=Path, default=Path("cost_model.json"), help="cost-model JSON")
    p.add_argument("--report", type=Path, default=None, help="JSON with every pack's timings")
    p.add_argument("--name", default="calibrated", help="name stored in the cost model")
    p.add_argument("--lengths", default=None, help="1-D .npy of a dataset's token counts")
    p.add_argument("--pack-size", type=int, default=8, help="records per pack B")
    p.add_argument("--packs", type=int, default=48, help="packs to time")
    p.add_argument("--min-tokens", type=int, default=16, help="shortest record")
    p.add_argument("--max-tokens", type=int, default=2048, help="longest record")
    p.add_argument("--pack-tokens", type=int, default=4096, help="most tokens in one pack")
    p.add_argument("--repeats", type=int, default=3, help="timings per pack (median kept)")
    p.add_argument("--warmup", type=int, default=3, help="untimed packs first")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--clock", choices=["cpu", "wall"], default="cpu", help="process CPU time or wall time"
    )
    p.add_argument("--layout", choices=LAYOUTS, default="packed", help="batch layout timed")
    p.add_argument("--holdout", type=float, default=0.25, help="fraction of packs held out")
    p.add_argument("--seed", type=int, default=0, help="seed of the designed packs")
    p.add_argument(
        "--min-r2", type=float, default=None, help="exit 1 if held-out R^2 is below this"
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = CalibrationConfig(
        pack_size=args.pack_size,
        n_packs=args.packs,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        pack_tokens=args.pack_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        threads=args.threads,
        layout=args.layout,
        clock=args.clock,
        holdout_fraction=args.holdout,
        seed=args.seed,
    )
    lengths = load_lengths(args.lengths) if args.lengths else None
    result = calibrate(
        args.model,
        config,
        lengths=lengths,
        name=args.name,
        presets=("tokens", "tinygpt"),
        progress=not args.json,
    )
    result.fit.model.save(args.out)
    report = result.report()
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=1) + "\n")
    summary = {key: value for key, value in report.items() if key != "packs"}
    summary["out"] = str(args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        m = result.fit.model
        print(
            f"cost model  c(L) = {m.a:.4g}*L + {m.b:.4g}*L^2 + {m.k:.4g}  [seconds] -> {args.out}"
        )
        print(
            f"fit         R^2 train {result.fit.r2_train:.4f}, held-out {result.fit.r2_holdout:.4f}"
            f", mean relative error held-out {result.fit.mean_rel_error_holdout:.3f}"
        )
        presets = ", ".join(f"{k} {v:.4f}" for k, v in result.preset_r2.items())
        print(f"presets     R^2 (best scale, all packs): {presets}")
        print(f"timing      median relative IQR of repeats {report['timing_rel_iqr_median']:.3f}")
    if args.min_r2 is not None and result.fit.r2_holdout < args.min_r2:
        print(f"held-out R^2 {result.fit.r2_holdout:.4f} < --min-r2 {args.min_r2}")
        return 1
    return 0
