"""Per-process planning cost in node count: the token contract beside the record contract.

One dataset of ``--records`` records (lognormal lengths, median ~450 tokens, capped at 8,192,
llama3-8b costs, shards of 4,096: ``bcl_bench.plan_scale``'s corpus, with its token counts
stored beside the costs as the cost index stores them), jobs of 1, 4, 16, 64 and 128 nodes x
8 ranks, G = 4; the record contract at B = 8, W = 16, the token contract at T = 16,384.
For each (contract, scope, nodes), one process (``bcl_bench.token_scale``, pinned to one
core, thread pools of 1) plans what rank 0's reader plans: its own row, the first window
and about ``token_scale.STEADY_RECORDS`` records after it. Each cell is run ``--repeats``
times, interleaved, and the fastest run kept. Reported: set-up and time to the first
micro-batch (wall), set-up in the process's CPU time (what a loaded machine does not inflate;
under ``tokens`` the streams a reader builds, ``build_token_streams``), and the steady planning time per record planned and per record of the
process's own rank (a row of 16 ranks plans 16 records per record of its own), in the
process's CPU time, so that other work on the machine does not count. Flat in node count = the per-record cost does
not grow with the job. Writes ``results/bench_token_scale.json`` and ``.png``.

    python tools/bench_token_scale.py --records 1e8 --repeats 1   # what results/ holds
    python tools/bench_token_scale.py --records 2e6 --nodes 1 4
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bcl_bench import token_scale
from bcl_bench.harness import RESULTS, bench_parser, run_on_one_core, write_result

NODES = (1, 4, 16, 64, 128)
CONTRACTS = ("pack", "tokens")


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in (
        (axes[0], "planning_us_per_record_planned", "us per record planned"),
        (axes[1], "time_to_first_pack_s", "s to the first micro-batch"),
    ):
        for contract in CONTRACTS:
            for scope, style in (("world", "-o"), ("rank", "--s")):
                sel = sorted(
                    (r for r in rows if r["contract"] == contract and r["scope"] == scope),
                    key=lambda r: r["nodes"],
                )
                if sel:
                    ax.plot(
                        [r["nodes"] for r in sel],
                        [r[key] for r in sel],
                        style,
                        label=f"{'tokens, T=16,384' if contract == 'tokens' else 'record, B=8'}"
                        f" scope {scope}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (x 8 ranks)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    n = rows[0]["records"] if rows else 0
    fig.suptitle(f"Per-process planning cost in node count ({n:,} records, one core)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_token_scale.json")
    parser.add_argument("--records", type=float, default=1e7)
    parser.add_argument("--nodes", nargs="+", type=int, default=list(NODES))
    parser.add_argument("--scopes", nargs="+", default=["world", "rank"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n = int(args.records)
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bcl_token_scale_") as tmp:
        tok, cost = Path(tmp) / "tokens.npy", Path(tmp) / "costs.npy"
        token_scale.write_index(n, tok, cost)
        for _ in range(args.repeats):
            for nodes in args.nodes:
                for scope in args.scopes:
                    for contract in CONTRACTS:
                        child = [str(tok), str(cost), contract, scope, str(nodes)]
                        row = run_on_one_core(["-m", token_scale.__name__, *child])
                        key = (contract, scope, nodes)
                        old = best.get(key)
                        if old is None or row["steady_cpu_s"] < old["steady_cpu_s"]:
                            best[key] = row
                        print(
                            f"{nodes:>4}x8 {scope:<5} {contract:<6} first "
                            f"{row['time_to_first_pack_s']:.2f} s  "
                            f"{row['planning_us_per_record_planned']:.2f} us/record planned "
                            f"({row['ranks_planned']} ranks)",
                            flush=True,
                        )
    rows = sorted(best.values(), key=lambda r: (r["contract"], r["scope"], r["nodes"]))
    payload = {
        "setting": {
            "records": n,
            "ranks_per_node": 8,
            "grad_accum": token_scale.ACCUM,
            "max_tokens": token_scale.MAX_TOKENS,
            "record_contract": {"pack_size": 8, "window": 16},
            "steady_records": token_scale.STEADY_RECORDS,
            "repeats": args.repeats,
            "kept": "the fastest steady run of each cell",
            "clocks": "setup_s wall, setup_cpu_s its process CPU; first_window_cpu_s and "
            "steady_cpu_s process CPU; "
            "time_to_first_pack_s = setup_s + first_window_cpu_s",
            "cost_model": "llama3-8b",
            "cores_used": 1,
        },
        "rows": rows,
    }
    write_result(payload, args.out)
    plot(rows, Path(args.out).with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
