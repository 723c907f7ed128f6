"""``bcl-stream inspect``: records, token/cost statistics, outliers and integrity of a dataset.

Exit code 0 when the cost index matches the shards, 1 when it does not (or is missing).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.analysis.inspection import inspect_dataset, shard_warnings
from bcl_stream.commands.layout_options import Layout, add_layout_options, resolve_layout
from bcl_stream.epoch.mixture_index import StreamSpec
from bcl_stream.planner.mixture import choose_counts


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="statistics and integrity of a costed dataset")
    p.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        default=None,
        help="MDS or WebDataset directory, or s3:// URL (or --stream, repeated)",
    )
    p.add_argument(
        "--stream",
        action="append",
        default=None,
        metavar="PATH[:proportion=P|repeat=R|choose=N]",
        help="inspect each stream of a mixture and its share (repeat the option)",
    )
    p.add_argument("--epoch-size", type=int, default=None, help="records per epoch of a mixture")
    p.add_argument("--max-tokens", type=int, default=None, help="report records above this cap")
    add_layout_options(
        p,
        world_help="the ranks the dataset is planned for (R): warn when it has too few shards "
        "for their nodes",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="token/cost histogram")
    p.set_defaults(run=run)


def _text(report: dict[str, Any]) -> list[str]:
    if report["format"] is None or not report["shards"]:
        # Nothing could be opened: statistics of nothing would only hide the verdict.
        return [f"{report['location']}: integrity: PROBLEMS"] + [
            f"  - {p}" for p in report["problems"]
        ]
    t, c = report["tokens"], report["cost"]
    lines = [
        f"{report['location']}: {report['format']} dataset, {report['records']} records in "
        f"{report['shards']} shards",
        f"tokens: total {t['total']:.0f}  mean {t['mean']:.1f}  p50 {t['p50']:.0f}  "
        f"p99 {t['p99']:.0f}  max {t['max']:.0f}",
        f"cost:   total {c['total']:.4g}  mean {c['mean']:.4g}  p99 {c['p99']:.4g}  "
        f"max {c['max']:.4g}",
        f"trained tokens (loss targets): total {report['trained']['total']:.0f} "
        f"({report['trained']['total'] / max(t['total'], 1):.1%} of the tokens)",
        f"cost model: {json.dumps(report['cost_model'])}",
    ]
    if report.get("image_tokens") is not None:
        i, p = report["image_tokens"], report["patches"]
        lines.append(
            f"images: {report['images']['count']} in {report['images']['records_with_images']} "
            f"records; image tokens total {i['total']:.0f} (mean {i['mean']:.1f} per record); "
            f"encoder patches total {p['total']:.0f} (max {p['max']:.0f} per image)"
        )
    out = report["outliers"]
    if out["max_tokens"] is not None:
        largest = ", ".join(f"#{o['record']} ({o['tokens']})" for o in out["largest"])
        lines.append(f"outliers above {out['max_tokens']} tokens: {out['count']} {largest}")
    pre = report.get("preprocess") or {}
    if pre.get("skipped_bad"):
        lines.append(f"skipped at preprocessing: {pre['skipped_bad']}")
    checks = report.get("checks") or {}
    took = f"{report.get('integrity_seconds', 0.0):.2f} s"
    verdict = "ok" if report["ok"] else "PROBLEMS"
    hashed = checks.get("content_hash")
    lines.append(
        f"integrity: {verdict} (checked in {took}: {', '.join(checks.get('checked', []))}; "
        f"content hash: {hashed or 'none'})"
    )
    lines += [f"  - {p}" for p in report["problems"]]
    if checks.get("not_detectable"):
        lines.append(f"integrity: not checked: {checks['not_detectable']}")
    if "planned_for" in report:
        lines.append(f"planned for node layout: {report['planned_for']['node_layout']}")
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    return lines


def _layout(args: argparse.Namespace) -> Layout | None:
    """The layout ``--world-size``/``--nodes``/``--ranks-per-node`` describe (None without
    them), checked before any data is read."""
    given = (args.layout_world_size, args.layout_nodes, args.layout_ranks_per_node)
    return None if given == (None, None, None) else resolve_layout(args)


def _add_warnings(report: dict[str, Any], layout: Layout | None) -> None:
    """Warnings for the layout the dataset is planned for (none without one)."""
    if layout is None or not report.get("shards"):
        return
    report["planned_for"] = layout.to_json()
    report["warnings"] = shard_warnings(
        int(report["shards"]), int(report["records"]), layout.world_size, layout.ranks_per_node
    )


def run_streams(args: argparse.Namespace, layout: Layout | None) -> int:
    """Every stream's report, plus its place in the mixture (weight, records per epoch)."""
    if args.plot is not None:
        raise ValueError("--plot takes one dataset; inspect the streams one at a time to plot")
    specs = [StreamSpec.parse(text) for text in args.stream]
    reports = [inspect_dataset(spec.path, max_tokens=args.max_tokens) for spec in specs]
    for report in reports:
        _add_warnings(report, layout)
    if all(r["format"] is not None and r["records"] for r in reports):
        per_epoch = choose_counts(
            [int(r["records"]) for r in reports],
            proportion=[s.proportion for s in specs],
            repeat=[s.repeat for s in specs],
            choose=[s.choose for s in specs],
            epoch_size=args.epoch_size,
        )
        total = sum(per_epoch)
        for report, spec, n in zip(reports, specs, per_epoch, strict=True):
            report["mixture"] = {**spec.to_dict(), "records_per_epoch": n, "share": n / total}
    if args.json:
        print(json.dumps({"streams": reports}))
    else:
        for report in reports:
            print("\n".join(_text(report)))
            mix = report.get("mixture")
            if mix:
                print(
                    f"mixture: {mix['records_per_epoch']} records per epoch "
                    f"({mix['share']:.1%} of the epoch)"
                )
    return 0 if all(r["ok"] for r in reports) else 1


def run(args: argparse.Namespace) -> int:
    if (args.directory is None) == (args.stream is None):
        raise ValueError("give a dataset DIR or --stream (repeated) for a mixture, not both")
    layout = _layout(args)
    if args.stream is not None:
        return run_streams(args, layout)
    report = inspect_dataset(args.directory, max_tokens=args.max_tokens, plot=args.plot)
    _add_warnings(report, layout)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(_text(report)))
    return 0 if report["ok"] else 1
