"""``bcl-stream calibrate``: time a model on packs, fit c(L) = a*L + b*L^2 + k, write the JSON.

The JSON is a cost model any reader or the simulator takes wherever a preset name goes
(``--cost-model cost_model.json``); shards are not rewritten, token counts are stored.

With ``--dataset DIR`` of image-text records (its index names ``bcl_components.npz``), image
packs are timed on a vision-language model and both terms of the two-term cost are fitted
(``analysis/calibrate_vision.py``); the JSON is then a two-term cost model, which
``simulate --cost-model`` takes (docs/vlm.md). ``--images`` does the same on designed image
packs alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bcl_stream.analysis.calibrate import CalibrationConfig, calibrate
from bcl_stream.analysis.calibrate_vision import ImagePackConfig, calibrate_images
from bcl_stream.commands.simulate import load_lengths
from bcl_stream.io.index import read_index
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.vision.components import RecordComponents, read_components

DEMO_MODEL = "lightning_module.tinygpt:TinyGPT"
"""The model ``--model`` defaults to: the demo's TinyGPT (the command line's choice; the
library's ``calibrate()`` requires a model)."""
VLM_MODEL = "bcl_bench.tiny_vlm:TinyQwen2VL"
"""The model image packs are timed on when ``--model`` is not given: a tiny Qwen2-VL."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time a model's forward+backward on packs and fit a cost model in seconds",
    )
    p.add_argument(
        "--model",
        default=None,
        help="'pkg.module:factory' returning a LightningModule, a module with loss(batch), "
        f"or a callable batch -> loss (default: the demo model {DEMO_MODEL}; for an "
        f"image-text --dataset, the tiny Qwen2-VL {VLM_MODEL})",
    )
    p.add_argument("--out", type=Path, default=Path("cost_model.json"), help="cost-model JSON")
    p.add_argument("--report", type=Path, default=None, help="JSON with every pack's timings")
    p.add_argument("--name", default="calibrated", help="name stored in the cost model")
    p.add_argument("--lengths", default=None, help="1-D .npy of a dataset's token counts")
    p.add_argument(
        "--dataset",
        default=None,
        metavar="DIR",
        help="a local costed dataset instead of --lengths: its records feed the sampled packs, "
        "and image-text records (bcl_components.npz) make the packs carry images and the "
        "fit two-term (vision encoder + language model)",
    )
    p.add_argument(
        "--images",
        action="store_true",
        help="time designed image packs and fit both terms without a dataset (as an image-text "
        "--dataset does)",
    )
    p.add_argument(
        "--max-side",
        type=int,
        default=32,
        help="image packs: largest image side in patches (grids are multiples of the merge size)",
    )
    p.add_argument(
        "--pack-patches", type=int, default=4096, help="image packs: most patches in one pack"
    )
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
    if args.dataset is not None and args.lengths is not None:
        raise ValueError("--dataset and --lengths both give the records' lengths: pass one")
    lengths, components = _dataset(args.dataset) if args.dataset else (None, None)
    if args.lengths:
        lengths = load_lengths(args.lengths)
    if components is not None or args.images:
        return _run_images(args, config, components)
    result = calibrate(
        args.model or DEMO_MODEL,
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


def _dataset(directory: str) -> tuple[Any, RecordComponents | None]:
    """A local dataset's token counts and (image-text) cost components."""
    index = read_index(directory)
    return index.tokens, read_components(directory, index.tokens)


def _run_images(
    args: argparse.Namespace, config: CalibrationConfig, components: RecordComponents | None
) -> int:
    """Image-text records: time image packs, fit both terms, write the two-term JSON."""
    result = calibrate_images(
        args.model or VLM_MODEL,
        config,
        ImagePackConfig(max_side=args.max_side, pack_patches=args.pack_patches),
        components=components,
        name=args.name,
        progress=not args.json,
    )
    model = result.fit.model
    args.out.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    report = result.report()
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=1) + "\n")
    summary = {key: value for key, value in report.items() if key != "packs"}
    summary["out"] = str(args.out)
    fit = result.fit
    if args.json:
        print(json.dumps(summary))
    else:
        v, lm = model.vision, model.language
        print(
            f"vision      {v.a:.4g}*P + {v.b:.4g}*P^2 + {v.k:.4g} per image of P patches "
            f"[seconds] -> {args.out}"
        )
        print(f"language    c(L) = {lm.a:.4g}*L + {lm.b:.4g}*L^2 + {lm.k:.4g}, L with image tokens")
        print(
            f"fit         R^2 train {fit.r2_train:.4f}, held-out {fit.r2_holdout:.4f}, "
            f"mean relative error held-out {fit.mean_rel_error_holdout:.3f}"
        )
        presets = ", ".join(f"{k} {v:.4f}" for k, v in result.preset_r2.items())
        print(f"shapes      R^2 (best scale, all packs): {presets}")
        print(f"timing      median relative IQR of repeats {report['timing_rel_iqr_median']:.3f}")
    if args.min_r2 is not None and fit.r2_holdout < args.min_r2:
        print(f"held-out R^2 {fit.r2_holdout:.4f} < --min-r2 {args.min_r2}")
        return 1
    return 0
