"""Scale-out benchmark: balance with 1 to 8 data-parallel ranks per node on 1 to 128 nodes.

Ten real corpora built offline from this machine's files, in their write order
(``bcl_bench/text_corpora.py``): manual pages, changelogs (long documents), the code of three
packages, sympy's docstrings (formulas), the standard library as chat records, man pages
sorted by length, and two mixtures written source by source. Each is repeated end to end to
``--sizes`` records (its order kept), capped at 8192 tokens and cut into shards of 4096
records, as a writer would. The defaults were chosen on ``text_corpora.TUNE``; the targets
are read on ``text_corpora.HELD_OUT``, which no choice looked at.

Layouts (nodes x data-parallel ranks per node): 1x8, 8x1 (TP=8 on 8 nodes), 16x2, 64x1, 4x8,
16x8, 64x8, 128x8. Settings: B=8, W=16, G=4, llama3-8b training-FLOPs costs, one sync per
micro-batch. Per (corpus, size, layout): efficiency of ``sequential``, the central peers
``verl_kk`` and ``nemo_mffd`` (``hf_rebalance`` up to :data:`HF_RANKS` ranks), ``bcl-node``
(rows of one node: what scope world planned before planner v4) and ``bcl-world`` with the
defaults and with each ablation of :data:`VARIANTS`; download amplification and displacement.
The peers read one global shuffle, so their packs depend on the world size alone: they are
planned once per (corpus, world size) and scored under each layout (amplification differs).

Usage::

    python tools/bench_scale_out.py                                   # the 1M matrix
    python tools/bench_scale_out.py --sizes 1e7 --layouts 64x8 128x8 --variants default --no-peers
    python tools/bench_scale_out.py --corpora man --layouts 8x1       # one cell
    python tools/bench_scale_out.py --process-only                    # per-process cost

Rows are merged into ``results/bench_scale_out.json`` (keyed by corpus, size and layout) after
every cell, so an interrupted run keeps what it measured; ``results/bench_scale_out.png`` is
drawn from the whole file.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import plan_scale, text_corpora
from bcl_bench.harness import RESULTS, bench_parser, run_on_one_core, write_result
from bcl_bench.plan_scale import PACK, SHARD, WINDOW
from bcl_stream.analysis.sim import Schedule, schedules, score, shard_table
from bcl_stream.cost import get_preset
from bcl_stream.planner import PlanConfig

ACCUM, CAP = 4, 8192
LAYOUTS = ((1, 8), (8, 1), (16, 2), (64, 1), (4, 8), (16, 8), (64, 8), (128, 8))
PEERS = ("verl_kk", "nemo_mffd", "hf_rebalance")
HF_RANKS = 8
"""``hf_rebalance`` runs up to this many ranks: its hill climbing over every optimizer step's
dp*grad_accum groups is pure Python (1M records, 8 ranks: about 8 s here; 200K records at 128
ranks took 52 s when planner v3 was measured)."""
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "world_row=16": {"world_row": 16},
    "world_row=32": {"world_row": 32},
    "max_amplification=16": {"max_amplification": 16.0},
    "max_amplification=256": {"max_amplification": 256.0},
    "lane=0": {"lane": 0},
    "lane_threshold=0.25": {"lane_threshold": 0.25},
    "lane_threshold=1": {"lane_threshold": 1.0},
}
"""bcl-world's ablation: each mechanism's setting moved one way and the other (``bcl-node``
is rows of one node)."""
TARGETS = {
    "8x1": (0.97, 0.93),
    "64x1": (0.93, None),
    "16x2": (0.93, None),
    "4x8": (0.97, 0.93),
    "64x8": (0.93, 0.88),
}
"""(median, worst) bcl-world efficiency on the held-out corpora at 1M records."""


def layout_name(nodes: int, per_node: int) -> str:
    return f"{nodes}x{per_node}"


def metrics_row(m: Any) -> dict[str, Any]:
    return {
        "efficiency": m.efficiency,
        "download_amplification": m.download_amplification,
        "displacement_steps_mean": m.displacement_steps_mean,
        "displacement_steps_max": m.displacement_steps_max,
        "packs_per_rank": m.packs_per_rank,
    }


def run_corpus(
    name: str, n: int, layouts: list[tuple[int, int]], variants: list[str], peers: bool
) -> Any:
    """Yield one result row per layout of corpus ``name`` at ``n`` records."""
    model = get_preset("llama3-8b")
    tok = text_corpora.build(name, n, CAP)
    costs = model.cost(tok)
    table = shard_table(tok, costs, SHARD)
    peer_cache: dict[tuple[str, int], Schedule] = {}
    for nodes, per_node in layouts:
        t0 = time.perf_counter()
        config = plan_scale.job(nodes, per_node, grad_accum=ACCUM)
        scheds = dict(schedules(tok, model, config, ("sequential", "bcl-node"), table))
        if peers:
            for p in PEERS:
                if p == "hf_rebalance" and config.ranks > HF_RANKS:
                    continue
                key = (p, config.ranks)
                if key not in peer_cache:
                    peer_cache[key] = schedules(tok, model, config, (p,), table)[p]
                scheds[p] = peer_cache[key]
        row: dict[str, Any] = {
            "corpus": name,
            "held_out": name in text_corpora.HELD_OUT,
            "records": n,
            "layout": layout_name(nodes, per_node),
            "nodes": nodes,
            "ranks_per_node": per_node,
            "shards_per_node": table.counts.size / nodes,
        }
        for s, m in score(scheds, config, table).items():
            row[s] = metrics_row(m)
        row["bcl-world"] = {}
        for v in variants:
            cfg = replace(config, **VARIANTS[v])
            m = score(schedules(tok, model, cfg, ("bcl-world",), table), cfg, table)
            row["bcl-world"][v] = metrics_row(m["bcl-world"])
        row["seconds"] = time.perf_counter() - t0
        yield row


def merge(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """The file's rows with ``rows`` replacing those of the same (corpus, records, layout)."""
    old = json.loads(path.read_text()).get("balance", []) if path.exists() else []
    key = lambda r: (r["corpus"], r["records"], r.get("layout"))  # noqa: E731
    new = {key(r): r for r in rows}
    kept = [r for r in old if "layout" in r and key(r) not in new]
    return kept + list(new.values())


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (records, layout) and corpus set: bcl-world's median and worst, the peers', where
    bcl-world falls below the best peer, and what the default loses to the best variant."""
    out: dict[str, Any] = {"cells": {}, "below_peers": [], "default_loss": [], "targets": {}}
    for n in sorted({r["records"] for r in rows}):
        for lay in [layout_name(*x) for x in LAYOUTS]:
            sel = [r for r in rows if r["records"] == n and r["layout"] == lay]
            if not sel:
                continue
            cell: dict[str, Any] = {}
            for part, sub in text_corpora.corpus_sets(sel):
                eff = [r["bcl-world"]["default"]["efficiency"] for r in sub]
                cell[part] = {
                    "corpora": len(sub),
                    "median": float(np.median(eff)),
                    "worst": float(np.min(eff)),
                    "worst_corpus": sub[int(np.argmin(eff))]["corpus"],
                    "bcl_node_median": float(np.median([r["bcl-node"]["efficiency"] for r in sub])),
                    **{
                        f"{p}_median": float(np.median([r[p]["efficiency"] for r in sub]))
                        for p in PEERS
                        if all(p in r for r in sub)
                    },
                    "amplification_max": max(
                        r["bcl-world"]["default"]["download_amplification"] for r in sub
                    ),
                    "displacement_max": max(
                        r["bcl-world"]["default"]["displacement_steps_max"] for r in sub
                    ),
                }
            out["cells"][f"{n}@{lay}"] = cell
            held = cell.get("held_out")
            if n == 1_000_000 and lay in TARGETS and held:
                med, worst = TARGETS[lay]
                out["targets"][lay] = {
                    "median": [held["median"], med, held["median"] >= med],
                    "worst": [held["worst"], worst, worst is None or held["worst"] >= worst],
                }
            for r in sel:
                world = r["bcl-world"]["default"]["efficiency"]
                best_peer = max([r[p]["efficiency"] for p in PEERS if p in r] or [0.0])
                if world < best_peer:
                    out["below_peers"].append([r["corpus"], n, lay, world, best_peer])
                variants = r["bcl-world"]
                best = max(variants, key=lambda v: variants[v]["efficiency"])
                loss = variants[best]["efficiency"] - world
                if loss > 0.01:
                    out["default_loss"].append([r["corpus"], n, lay, best, round(loss, 4)])
    return out


def run_process(records: int) -> list[dict[str, Any]]:
    """Per-process planning cost (bench_plan_scale's measurement): scopes rank and world at 8
    ranks per node, scope world at 1 rank per node (a row of 8 nodes), 8 to 128 nodes."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bcl_scale_out_") as tmp:
        path = Path(tmp) / "costs.npy"
        plan_scale.write_costs(records, path)
        for nodes, per_node, scope in [
            (k, p, s) for k in (8, 32, 128) for p, s in ((8, "rank"), (8, "world"), (1, "world"))
        ]:
            row = run_on_one_core(
                ["-m", plan_scale.__name__, str(path), scope, str(nodes), str(per_node)]
            )
            out.append(row)
            print(
                f"{nodes:>4}x{per_node} {scope:<5} first pack {row['time_to_first_pack_s']:.2f} s"
                f"  {row['planning_us_per_rank_record']:.2f} us/own record "
                f"({row['ranks_planned']} ranks planned)  private "
                f"{row['private_rss_growth_mb']:.0f} MB",
                flush=True,
            )
    return out


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["records"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 4.4), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        lays = [layout_name(*x) for x in LAYOUTS if any(r["layout"] == layout_name(*x)
                and r["records"] == n for r in rows)]  # fmt: skip
        x = np.arange(len(lays))
        for s in ("bcl-world", "bcl-node", "verl_kk", "nemo_mffd", "sequential"):
            med = []
            for lay in lays:
                sel = [
                    r for r in rows if r["records"] == n and r["layout"] == lay and r["held_out"]
                ]
                vals = [
                    (r[s]["default"] if s == "bcl-world" else r[s])["efficiency"]
                    for r in sel
                    if s in r
                ]
                med.append(np.median(vals) if vals else np.nan)
            ax.plot(x, med, marker="o", label=s, lw=2.4 if s == "bcl-world" else 1.2)
        ax.set_xticks(x, lays)
        ax.set_xlabel("nodes x data-parallel ranks per node")
        ax.set_ylabel("balance efficiency (median, held-out corpora)")
        ax.set_title(f"{n:,} records")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The tables docs/balance.md and the README carry, rendered from the rows."""
    summary = summarize(rows)
    lines = [
        "| records | layout | held out: bcl-world median / worst | tuned on: median / worst "
        "| bcl-node (held out, median) | verl_kk (held out) | nemo_mffd (held out) "
        "| amplification (max) "
        "| displacement max (steps) | target (median / worst) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, cell in summary["cells"].items():
        n, lay = key.split("@")
        held, tune = cell.get("held_out", {}), cell.get("tune", {})
        med, worst = TARGETS.get(lay, (None, None)) if n == "1000000" else (None, None)
        both = [c for c in (held, tune) if c]
        lines.append(
            f"| {int(n) / 1e6:g}M | {lay} | {_f(held.get('median'))} / {_f(held.get('worst'))} "
            f"| {_f(tune.get('median'))} / {_f(tune.get('worst'))} "
            f"| {_f(held.get('bcl_node_median'))} | {_f(held.get('verl_kk_median'))} "
            f"| {_f(held.get('nemo_mffd_median'))} "
            f"| {max(c['amplification_max'] for c in both):.1f} "
            f"| {max(c['displacement_max'] for c in both):.0f} "
            f"| {_f(med) if med else '-'} / {_f(worst) if worst else '-'} |"
        )
    below = summary["below_peers"]
    lines += [
        "",
        "Cells where bcl-world is below the best peer: "
        + ("none" if not below else "; ".join(
            f"{c} {n / 1e6:g}M {lay}: {w:.3f} < {p:.3f}" for c, n, lay, w, p in below)),
        "",
        "Cells where the default loses more than 1 point to a variant: "
        + ("none" if not summary["default_loss"] else "; ".join(
            f"{c} {n / 1e6:g}M {lay}: {v} +{d:.3f}" for c, n, lay, v, d in summary["default_loss"])),
    ]  # fmt: skip
    lines += [
        "",
        "| corpus | set | records | layout | sequential | nemo_mffd | verl_kk | hf_rebalance "
        "| bcl-node | bcl-world | amplification | displacement mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {layout_name(*x): i for i, x in enumerate(LAYOUTS)}
    for r in sorted(rows, key=lambda r: (r["records"], r["held_out"], r["corpus"],
                                         order[r["layout"]])):  # fmt: skip
        w = r["bcl-world"]["default"]
        cols = [_f(r[s]["efficiency"]) if s in r else "-" for s in
                ("sequential", "nemo_mffd", "verl_kk", "hf_rebalance", "bcl-node")]  # fmt: skip
        lines.append(
            f"| {r['corpus']} | {'held out' if r['held_out'] else 'tune'} | "
            f"{r['records'] / 1e6:g}M | {r['layout']} | {' | '.join(cols)} | "
            f"**{w['efficiency']:.3f}** | {w['download_amplification']:.1f} | "
            f"{w['displacement_steps_mean']:.2f} / {int(w['displacement_steps_max'])} |"
        )
    variants = [v for v in rows[0]["bcl-world"] if v != "default"] if rows else []
    lines += [
        "",
        "| layout (1M) | " + " | ".join(variants) + " | default's largest loss to the best |",
        "|---|" + "---|" * (len(variants) + 1),
    ]
    for lay in [layout_name(*x) for x in LAYOUTS]:
        sel = [r for r in rows if r["records"] == 1_000_000 and r["layout"] == lay]
        sel = [r for r in sel if all(v in r["bcl-world"] for v in variants)]
        if not sel:
            continue
        cells = []
        for v in variants:
            d = [r["bcl-world"][v]["efficiency"] - r["bcl-world"]["default"]["efficiency"]
                 for r in sel]  # fmt: skip
            cells.append(f"{np.median(d):+.3f} ({min(d):+.3f} .. {max(d):+.3f})")
        loss = [
            (max(x["efficiency"] for x in r["bcl-world"].values())
             - r["bcl-world"]["default"]["efficiency"], r["corpus"])
            for r in sel
        ]  # fmt: skip
        worst = max(loss)
        lines.append(f"| {lay} | " + " | ".join(cells) + f" | {worst[0]:.3f} ({worst[1]}) |")
    return "\n".join(lines) + "\n"


def write(path: Path, rows: list[dict[str, Any]], process: list[dict[str, Any]] | None) -> None:
    old = json.loads(path.read_text()) if path.exists() else {}
    payload = {
        "setting": {
            "pack_size": PACK,
            "window": WINDOW,
            "grad_accum": ACCUM,
            "shard_records": SHARD,
            "cost_model": "llama3-8b",
            "max_record_tokens": CAP,
            "tune_corpora": list(text_corpora.TUNE),
            "held_out_corpora": list(text_corpora.HELD_OUT),
            "variants": VARIANTS,
            "default_max_amplification": PlanConfig.__dataclass_fields__[
                "max_amplification"
            ].default,
            "hf_rebalance_up_to_ranks": HF_RANKS,
        },
        "targets": {k: {"median": m, "worst": w} for k, (m, w) in TARGETS.items()},
        "summary": summarize(rows) if rows else {},
        "balance": rows,
        "process": old.get("process", []) if process is None else process,
    }
    write_result(payload, path)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_scale_out.json")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6])
    parser.add_argument("--layouts", nargs="+", default=[layout_name(*x) for x in LAYOUTS])
    parser.add_argument("--corpora", nargs="+", default=list(text_corpora.NAMES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--process-records", type=float, default=1e8)
    parser.add_argument("--process-only", action="store_true")
    parser.add_argument("--report", action="store_true", help="redraw .png and .md from --out")
    args = parser.parse_args(argv)
    if args.report:  # the rows as measured; the setting they were measured with stays
        rows = json.loads(args.out.read_text())["balance"]
        plot(rows, args.out.with_suffix(".png"))
        args.out.with_suffix(".md").write_text(markdown(rows))
        return 0
    if args.process_only:
        rows = json.loads(args.out.read_text())["balance"] if args.out.exists() else []
        write(args.out, rows, run_process(int(args.process_records)))
        return 0
    layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts]
    done: list[dict[str, Any]] = []
    for n in (int(s) for s in args.sizes):
        for name in args.corpora:
            for row in run_corpus(name, n, layouts, args.variants, not args.no_peers):  # type: ignore[arg-type]
                done.append(row)
                rows = merge(done, args.out)
                write(args.out, rows, None)
                world = row["bcl-world"]["default"]["efficiency"]
                peers = "  ".join(f"{p} {row[p]['efficiency']:.3f}" for p in PEERS if p in row)
                print(
                    f"{name:<28} {n:>10,} {row['layout']:>6}  bcl-world {world:.3f} (amp "
                    f"{row['bcl-world']['default']['download_amplification']:.1f})  bcl-node "
                    f"{row['bcl-node']['efficiency']:.3f}  {peers}  {row['seconds']:.0f} s",
                    flush=True,
                )
    rows = merge(done, args.out)
    write(args.out, rows, None)
    plot(rows, args.out.with_suffix(".png"))
    args.out.with_suffix(".md").write_text(markdown(rows))
    print(f"wrote {args.out} and its .png and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
