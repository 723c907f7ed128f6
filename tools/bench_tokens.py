"""The token-budget contract on the real corpora: 1 node x 8 ranks, T = 16,384, G = 4, llama3-8b.

For every corpus of ``bcl_bench/text_corpora.py`` (in write order, records capped at 8,192
tokens, repeated to ``--records``), under ``contract="tokens"`` at the same budget T:
``bcl-world``, ``bcl-node`` and ``bcl-rank`` against the token-budget peers (``verl_dynbsz``,
``nemo_mffd``, ``multipack``, ``trl_token_budget``, ``pooled_mffd_split``), and the record contract (``bcl-world``
with B=8, W=16) against the tokens contract at the same memory: T = the largest pack B=8
produced. Each cell reports efficiency, fill (mean micro-batch tokens / T), micro-batches per
rank (min, max), the largest micro-batch, and the modeled time per unit of useful cost at
``--micro-batch-overhead`` 0 and 0.1 (``analysis/sim.py``). Beside them: ``verl_dynbsz``
held to the same peak memory (its ``max_token_len`` lowered by bisection until no micro-batch
exceeds T, priced at T: :func:`verl_at_peak`), and the bound no packer can beat at T under the
time model (perfect balance, every micro-batch exactly T tokens: :func:`bound`). Corpora are
split as the other
benchmarks split them: ``text_corpora.TUNE`` (what any default was chosen on) and
``text_corpora.HELD_OUT`` (reported apart).

    python tools/bench_tokens.py                       # every corpus, 200K records each
    python tools/bench_tokens.py --corpora man --records 50000
    python tools/bench_tokens.py --corpora man code:networkx=3000000 --nodes 128  # per-corpus size
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import text_corpora
from bcl_bench.harness import (
    RESULTS,
    bench_parser,
    markdown_table,
    parse_or_print_table,
    write_result,
)
from bcl_stream.analysis.sim import (
    SimConfig,
    budget_figures,
    micro_batch_price,
    plan_schedules,
    score,
    shard_table,
)
from bcl_stream.cost import get_preset

T, CAP, ACCUM, RANKS = 16_384, 8192, 4, 8
PEERS = ("verl_dynbsz", "nemo_mffd", "multipack", "trl_token_budget", "pooled_mffd_split")
BCL = ("bcl-world", "bcl-node", "bcl-rank")
OVERHEADS = (0.0, 0.1)


def cell(
    tok: np.ndarray,
    costs: np.ndarray,
    config: SimConfig,
    names: tuple[str, ...],
    priced_at: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each strategy's figures under ``config`` at every overhead of :data:`OVERHEADS`, the
    micro-batch price taken at budget ``priced_at`` (None: ``config.max_tokens``), so that a
    peer planned at a lower budget is still charged the price of the same T."""
    table = shard_table(tok, costs, config.shard_records)
    planned = plan_schedules(tok, costs, table, config, names)
    out: dict[str, dict[str, Any]] = {}
    for f in OVERHEADS:
        priced = replace(config, micro_batch_overhead=f)
        at = priced if priced_at is None else replace(priced, max_tokens=priced_at)
        metrics = score(planned, priced, price=micro_batch_price(tok, costs, at))
        for name, s in planned.items():
            row = out.setdefault(name, budget_figures(s, tok))
            row["efficiency" if f == 0 else f"efficiency_overhead_{f}"] = metrics[name].efficiency
            row[f"time_per_cost_overhead_{f}"] = metrics[name].time / row["useful_cost"]
            row["records_left"] = metrics[name].records_left
    budget = config.max_tokens or 0
    for row in out.values():
        row["fill"] = row["micro_batch_tokens"]["mean"] / budget if budget else None
    return out


def verl_at_peak(
    tok: np.ndarray, costs: np.ndarray, config: SimConfig, widest: int, steps: int = 6
) -> dict[str, Any]:
    """``verl_dynbsz`` held to the same peak memory as everyone else: verl splits each rank's
    share by workload with no per-part token cap, so at ``ppo_max_token_len_per_gpu`` = T
    some of its micro-batches exceed T (``widest`` tokens). Bisection finds the largest
    ``max_token_len`` whose largest micro-batch is at most T, starting from the bracket
    [0.97 T^2 / widest, T] (verl's widest micro-batch grows about in proportion to its
    budget; the lower end is lowered by 3% steps until it holds); ``steps`` halvings leave
    the bracket under 50 tokens wide on these corpora. Its figures are priced at T like
    every other strategy's."""
    budget = config.max_tokens
    assert budget is not None

    def at(limit: int) -> dict[str, Any]:
        row = cell(tok, costs, replace(config, max_tokens=limit), ("verl_dynbsz",), budget)
        return {**row["verl_dynbsz"], "max_token_len": limit}

    lo = budget if widest <= budget else int(0.97 * budget * budget / widest)
    best = at(lo)
    while best["micro_batch_tokens"]["max"] > budget and lo > 1:
        lo = int(lo * 0.97)
        best = at(lo)
    hi = budget if widest > budget else lo  # within T already: nothing to search
    for _ in range(steps):
        if hi <= lo:
            break
        mid = (lo + hi + 1) // 2
        row = at(mid)
        if row["micro_batch_tokens"]["max"] <= budget:
            lo, best = mid, row
        else:
            hi = mid - 1
    best["fill"] = best["micro_batch_tokens"]["mean"] / budget
    return best


def bound(me: dict[str, Any], ranks: int) -> float:
    """Time per unit of useful cost at F = 0.1 that no packer can beat at this budget under
    the time model: perfect balance (efficiency 1) and every micro-batch exactly T tokens
    (fill 1), i.e. ``me``'s price share scaled to fill 1."""
    k1, k0 = "time_per_cost_overhead_0.1", "time_per_cost_overhead_0.0"
    return 1.0 / ranks + (me[k1] - me[k0]) * me["fill"]


def run_corpus(
    name: str,
    n: int,
    nodes: int = 1,
    per_node: int = RANKS,
    peers: tuple[str, ...] = PEERS,
    same_memory: bool = True,
    verl_peak: bool = True,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    tok = text_corpora.build(name, n, CAP)
    costs = get_preset("llama3-8b").cost(tok)
    base = SimConfig(
        ranks=nodes * per_node, ranks_per_node=per_node, grad_accum=ACCUM, shard_records=4096
    )
    tokens = replace(base, contract="tokens", max_tokens=T)
    row: dict[str, Any] = {
        "corpus": name,
        "held_out": name in text_corpora.HELD_OUT,
        "records": n,
        "layout": f"{nodes}x{per_node}",
        "mean_tokens": float(tok.mean()),
        "at_T": cell(tok, costs, tokens, (*BCL, *peers)),
    }
    if "verl_dynbsz" in peers and verl_peak:
        widest = int(row["at_T"]["verl_dynbsz"]["micro_batch_tokens"]["max"])
        row["verl_dynbsz_peak_T"] = verl_at_peak(tok, costs, tokens, widest)
    row["bound_time_per_cost_overhead_0.1"] = bound(row["at_T"]["bcl-world"], nodes * per_node)
    if not same_memory:
        row["seconds"] = time.perf_counter() - t0
        return row
    record = cell(tok, costs, base, ("bcl-world",))["bcl-world"]
    memory = int(record["micro_batch_tokens"]["max"])
    record_at = cell(tok, costs, replace(base, max_tokens=memory), ("bcl-world",))
    token_at = cell(tok, costs, replace(tokens, max_tokens=memory), ("bcl-world", "verl_dynbsz"))
    row["same_memory"] = {
        "T": memory,
        "record_B8": record_at["bcl-world"],
        "tokens": token_at["bcl-world"],
        "verl_dynbsz": token_at["verl_dynbsz"],
    }
    row["seconds"] = time.perf_counter() - t0
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst of the headline figures, tune and held-out corpora apart."""
    out: dict[str, Any] = {}
    for part, sel in text_corpora.corpus_sets(rows):
        eff = [r["at_T"]["bcl-world"]["efficiency"] for r in sel]
        fill = [r["at_T"]["bcl-world"]["fill"] for r in sel]
        out[part] = {
            "corpora": [r["corpus"] for r in sel],
            "bcl_world_efficiency": {"median": float(np.median(eff)), "worst": min(eff)},
            "bcl_world_fill": {"median": float(np.median(fill)), "worst": min(fill)},
        }
        key = "time_per_cost_overhead_0.1"
        for peer in PEERS:
            if all(peer in r["at_T"] for r in sel):
                vs = [r["at_T"][peer][key] / r["at_T"]["bcl-world"][key] for r in sel]
                out[part][f"speedup_vs_{peer}_overhead_0.1"] = {
                    "median": float(np.median(vs)),
                    "worst": min(vs),
                }
        if all("verl_dynbsz_peak_T" in r for r in sel):
            vs = [r["verl_dynbsz_peak_T"][key] / r["at_T"]["bcl-world"][key] for r in sel]
            out[part]["speedup_vs_verl_dynbsz_peak_T_overhead_0.1"] = {
                "median": float(np.median(vs)),
                "worst": min(vs),
            }
        if all("verl_dynbsz" in r["at_T"] for r in sel):
            vs = [
                r["at_T"]["verl_dynbsz"][key] / r["bound_time_per_cost_overhead_0.1"] for r in sel
            ]
            out[part]["bound_vs_verl_dynbsz_overhead_0.1"] = {
                "median": float(np.median(vs)),
                "worst": min(vs),
            }
        if all("same_memory" in r for r in sel):
            vs = [r["same_memory"]["record_B8"][key] / r["same_memory"]["tokens"][key] for r in sel]
            out[part]["speedup_vs_record_B8_same_memory_overhead_0.1"] = {
                "median": float(np.median(vs)),
                "worst": min(vs),
            }
    return out


def layout_markdown(result: dict[str, Any]) -> str:
    """The multi-node table docs/balance.md carries (runs with ``--no-same-memory``): per
    corpus, bcl-world's efficiency, fill, micro-batches per rank and largest micro-batch, and
    each peer's efficiency and modeled time over bcl-world's at F = 0.1."""
    rows = result["rows"]
    peers = [p for p in PEERS if rows and all(p in r["at_T"] for r in rows)]
    columns = [
        "layout", "corpus", "records", "bcl-world efficiency / fill",
        "micro-batches per rank (min = max)", "largest micro-batch", "bcl-node",
        *(f"{p} efficiency (time vs bcl-world, F=0.1)" for p in peers),
        "bound vs verl_dynbsz (F=0.1)", "left",
    ]  # fmt: skip
    key = "time_per_cost_overhead_0.1"
    lines = []
    for r in rows:
        at = r["at_T"]
        w, counts = at["bcl-world"], at["bcl-world"]["micro_batches_per_rank"]
        equal = "=" if counts["min"] == counts["max"] else "!="
        cells = [f"{at[p]['efficiency']:.4f} ({at[p][key] / w[key]:.3f})" for p in peers]
        bound = (
            f"{at['verl_dynbsz'][key] / r['bound_time_per_cost_overhead_0.1']:.3f}"
            if "verl_dynbsz" in at
            else "-"
        )
        lines.append(
            [
                r["layout"].replace("x", " x "),
                f"{r['corpus']}{' (held out)' if r['held_out'] else ''}",
                f"{r['records']:,}",
                f"{w['efficiency']:.4f} / {w['fill']:.3f}",
                f"{counts['min']} {equal} {counts['max']}",
                f"{w['micro_batch_tokens']['max']:,}",
                f"{at['bcl-node']['efficiency']:.4f}",
                *cells,
                bound,
                f"{w['records_left']:,} ({w['records_left'] / r['records']:.1%})",
            ]
        )
    return markdown_table(columns, lines)


def markdown(result: dict[str, Any]) -> str:
    """The per-corpus table docs/balance.md carries (held-out corpora marked); for runs
    without the same-memory comparison (the multi-node cells), :func:`layout_markdown`."""
    if result["rows"] and "same_memory" not in result["rows"][0]:
        return layout_markdown(result)
    columns = [
        "corpus", "bcl-world efficiency", "fill", "micro-batches per rank (min = max)",
        "time vs verl_dynbsz (F=0 / 0.1)", "bound vs verl_dynbsz (F=0.1)",
        "vs verl_dynbsz held to T (F=0.1)", "vs multipack (F=0.1)", "vs nemo_mffd (F=0.1)",
        "vs trl_token_budget (F=0.1)", "same memory T", "record B=8 -> tokens at T (F=0 / 0.1)",
    ]  # fmt: skip
    lines = []
    for r in result["rows"]:
        at, mem = r["at_T"], r["same_memory"]
        w = at["bcl-world"]

        def vs(peer: str, f: float, cells: dict[str, Any] = at, me: dict[str, Any] = w) -> str:
            key = f"time_per_cost_overhead_{f}"
            return f"{cells[peer][key] / me[key]:.3f}"

        key1 = "time_per_cost_overhead_0.1"
        held = r.get("verl_dynbsz_peak_T")
        peak = f"{held[key1] / w[key1]:.3f} ({held['max_token_len']})" if held else "-"
        counts = w["micro_batches_per_rank"]
        equal = "=" if counts["min"] == counts["max"] else "!="
        rec, tok = mem["record_B8"], mem["tokens"]
        lines.append(
            [
                f"{r['corpus']}{' (held out)' if r['held_out'] else ''}",
                f"{w['efficiency']:.4f}",
                f"{w['fill']:.3f}",
                f"{counts['min']} {equal} {counts['max']}",
                f"{vs('verl_dynbsz', 0.0)} / {vs('verl_dynbsz', 0.1)}",
                f"{at['verl_dynbsz'][key1] / r['bound_time_per_cost_overhead_0.1']:.3f}",
                peak,
                vs("multipack", 0.1),
                vs("nemo_mffd", 0.1),
                vs("trl_token_budget", 0.1),
                f"{mem['T']}",
                f"{rec['time_per_cost_overhead_0.0'] / tok['time_per_cost_overhead_0.0']:.3f} / "
                f"{rec['time_per_cost_overhead_0.1'] / tok['time_per_cost_overhead_0.1']:.3f}",
            ]
        )
    return markdown_table(columns, lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_tokens.json")
    parser.add_argument(
        "--corpora",
        nargs="+",
        default=list(text_corpora.NAMES),
        help="corpus names; NAME=N repeats that corpus to N records instead of --records",
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--ranks-per-node", type=int, default=RANKS)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated")
    parser.add_argument(
        "--no-same-memory", action="store_true", help="skip the record contract comparison"
    )
    parser.add_argument(
        "--no-verl-peak",
        action="store_true",
        help="skip verl_dynbsz held to the same peak memory (a bisection of its budget)",
    )
    args = parse_or_print_table(parser, argv, markdown)
    if args is None:
        return 0
    rows = []
    for spec in args.corpora:
        name, _, size = spec.partition("=")  # "corpus=N": N records for this corpus
        peers = tuple(p for p in args.peers.split(",") if p)
        rows.append(
            run_corpus(
                name,
                int(float(size)) if size else args.records,
                args.nodes,
                args.ranks_per_node,
                peers,
                not args.no_same_memory,
                not args.no_verl_peak,
            )
        )
        r = rows[-1]
        w = r["at_T"]["bcl-world"]
        print(
            f"{name}: eff {w['efficiency']:.3f} fill {w['fill']:.3f} "
            f"mb/rank {w['micro_batches_per_rank']} ({r['seconds']:.0f}s)",
            flush=True,
        )
        write_result(result_of(args, rows), Path(args.out))  # an interrupted run keeps its rows
    return 0


def result_of(args: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The result file: settings, the corpus split, every row and the summary."""
    return {
        "settings": {
            "max_tokens": T,
            "record_cap": CAP,
            "grad_accum": ACCUM,
            "ranks": args.nodes * args.ranks_per_node,
            "ranks_per_node": args.ranks_per_node,
            "cost_model": "llama3-8b",
            "records": args.records,
            "overheads": list(OVERHEADS),
        },
        "tune_corpora": list(text_corpora.TUNE),
        "held_out_corpora": list(text_corpora.HELD_OUT),
        "rows": rows,
        "summary": summary(rows),
    }


if __name__ == "__main__":
    raise SystemExit(main())
