"""Balance benchmark: planner v2 against the real peers, on i.i.d. and on ordered corpora.

Real data is written in order (source by source, sorted by length, by path), so besides the
i.i.d. length profiles of bcl_bench/corpora.py every figure is also taken on ordered corpora, in
write order, cut into shards of 4096 records as a writer would:

- ``sorted:<profile>``: a profile written sorted by length (1M records);
- ``mixture``: four sources written one after another (gsm8k 0.4, alpaca 0.3, evol_code 0.2,
  longalpaca 0.1: the last about 6x costlier per record than the mean of the others), 1M;
- ``stdlib``: every documented function of the standard library, in module order (cl100k);
- ``sitepackages``: every function of every ``.py`` file of this environment's site-packages,
  in path order (cl100k, ~516K records, capped at 8192 tokens).

Settings (docs/metrics.md metrics, llama3-8b training-FLOPs costs, B=8, G=4, records <= 8192 tokens):
- ``1node``: 8 ranks on one node; ``bcl-rank`` at W=32 (and 16), ``bcl-node`` at W=16 (one node:
  the same as ``bcl-world``);
- ``4node``: 4 nodes x 8 ranks, W=16: every scope, download amplification and shard working set.
- ``padded``: the same 8 ranks with the padded layout (a micro-batch costs its size x its
  costliest record): BCL with exactly B per micro-batch and with ``contract="step"`` (G*B per
  rank and step, micro-batches of varying size: ``+step``), against ``hf_rebalance``, whose
  home layout this is.
Peers: ``sequential`` (a plain loader over the same shards), ``nemo_mffd``, ``verl_kk`` and
``hf_rebalance`` (the real systems; the first two central, Transformers' sampler on every rank
from a shared seed; all reading a global shuffle), ``verl_dynbsz`` (breaks the record-count
contract; shown, not a target). ``hf_rebalance`` runs in the 1-node settings only (its
hill climbing over R*G groups is quadratic in the world size: too slow at 32 ranks here).

Derived numbers:
- cross-rank CV reduction of X = 1 - cv_ranks(X) / cv_ranks(sequential);
- speedup of X over Y = (T(Y)/cost(Y)) / (T(X)/cost(X)): time per unit of useful cost emitted
  (the records' own costs, padding excluded), equal to docs/metrics.md's T(Y)/T(X) when both emit
  the same records;
- ``imbalance_sq``: torchtitan's figure, mean over micro-batches of max/mean across ranks of
  the sum of squared lengths;
- ``_step`` suffix: the same with one synchronization per optimizer step (G micro-batches).

Writes results/bench_balance.json, results/bench_balance.md and results/bench_balance_*.png
(``--out results/NAME.json``: NAME.json, NAME.md, NAME_*.png).
Usage::

    python tools/bench_balance.py           # full: 1M-record ordered corpora (about 15 minutes)
    python tools/bench_balance.py --quick   # 200K records, fewer profiles (about 2 minutes)
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one core: set before numpy loads its BLAS thread pool
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from bcl_bench.corpora import PROFILES, sitepackages_lengths, stdlib_lengths
from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_bench.scores import ACCUM, score
from bcl_stream.analysis.sim import Schedule, SimConfig, schedules, shard_table
from bcl_stream.analysis.sim import score as sim_score
from bcl_stream.cost import CostModel, get_preset

RANKS, PACK, MAX_RECORD_TOKENS = 8, 8, 8192
COST_MODEL = "llama3-8b"
SHARD_RECORDS = 4096
PEERS = ("nemo_mffd", "verl_kk", "hf_rebalance")
SORTED = ("sharegpt", "lmsys_chat", "tulu3_mix", "pareto_tail")
MIXTURE = (("gsm8k", 0.4), ("alpaca", 0.3), ("evol_code", 0.2), ("longalpaca", 0.1))
TARGETS = {
    "rank_w32_cv_reduction_median": 0.85,
    "rank_w32_cv_reduction_worst": 0.78,
    "multinode_w16_efficiency_median": 0.97,
    "multinode_w16_efficiency_worst": 0.93,
    "download_amplification_max": 1.05,
    "world_vs_nemo_mffd_median": 1.17,
    "world_vs_verl_kk_median": 1.05,
    "rank_w32_vs_verl_kk_median": 1.0,
    "padded_world_vs_hf_rebalance_median": 1.05,
    "padded_world_vs_hf_rebalance_worst": 1.0,
    "packed_world_vs_hf_rebalance_median": 1.10,
}
Lengths = npt.NDArray[np.int64]


def corpora(
    n_ordered: int, n_iid: int, quick: bool
) -> dict[str, tuple[str, Callable[[], Lengths]]]:
    """name -> (kind, builder) in write order. Kinds: ``iid``, ``ordered``, ``real``."""
    cap = MAX_RECORD_TOKENS
    out: dict[str, tuple[str, Callable[[], Lengths]]] = {}
    profiles = ["sharegpt", "tulu3_mix", "lmsys_chat", "alpaca"] if quick else list(PROFILES)
    for name in profiles:
        out[f"iid:{name}"] = ("iid", lambda p=PROFILES[name]: p(n_iid, 0, max_tokens=cap))
    for name in SORTED:
        out[f"sorted:{name}"] = (
            "ordered",
            lambda p=PROFILES[name]: np.sort(p(n_ordered, 0, max_tokens=cap)),
        )

    def mixture() -> Lengths:
        parts = [PROFILES[p](int(n_ordered * w), 1, max_tokens=cap) for p, w in MIXTURE]
        return np.concatenate(parts)

    out["mixture"] = ("ordered", mixture)
    out["stdlib"] = ("real", lambda: np.minimum(stdlib_lengths("cl100k"), cap))
    if not quick:
        out["sitepackages"] = ("real", lambda: np.minimum(sitepackages_lengths(), cap))
    return out


def run_setting(
    tok: Lengths,
    model: CostModel,
    ranks: int,
    per_node: int,
    labels: tuple[str, ...],
    layout: str = "packed",
) -> dict[str, dict[str, float]]:
    """strategy label -> scores, for the settings the labels name (:func:`plan_of`)."""
    base_cfg = SimConfig(
        ranks=ranks, ranks_per_node=per_node, pack_size=PACK, grad_accum=ACCUM,
        shard_records=SHARD_RECORDS, layout=layout,
    )  # fmt: skip
    table = shard_table(tok, model.cost(tok), SHARD_RECORDS)
    planned: dict[str, Schedule] = {}
    configs: dict[str, SimConfig] = {}
    for label in labels:
        strategy, window, extra = plan_of(label)
        cfg = dataclasses.replace(base_cfg, window=window, **extra)
        planned[label] = schedules(tok, model, cfg, (strategy,), table)[strategy]
        configs[label] = cfg
    base = {name: planned[name] for name in ("sequential", *PEERS) if name in planned}
    out: dict[str, dict[str, float]] = {}
    for label, s in planned.items():
        row = score(s, base)
        locality = sim_score({label: s}, configs[label], table)[label]
        row["download_amplification"] = locality.download_amplification
        row["shard_working_set"] = float(locality.shard_working_set)
        out[label] = row
    return out


PEER_WINDOW = 16
"""W of the peers' settings (their labels name no window)."""
VARIANTS: dict[str, dict[str, Any]] = {
    "step": {"contract": "step"},
    "pooled": {"ranks_per_node": 4 * RANKS},
    "no_stratify": {"stratify": False},
    "carry_wb4": {"carry": None},
    "no_step_fill": {"step_fill": False},
    "no_split_shards": {"split_shards": 0.0},
    "shard_group_8": {"shard_group": 8},
    "shard_group_32": {"shard_group": 32},
}
"""What a label's ``+variant`` changes in the SimConfig. ``bcl-node+pooled``: all 32 ranks
planned as one node, i.e. records moved freely between nodes (every node reads every shard): a
bound for what locality costs, not a strategy to run."""


def plan_of(label: str) -> tuple[str, int, dict[str, Any]]:
    """``<strategy>[+<variant>][@<W>]`` -> (strategy, W, SimConfig fields the variant sets).

    Why the label alone: the tables and reports name a setting by its label, so the label is
    the one place that says what ran (a peer's label is its strategy, run at ``PEER_WINDOW``).
    """
    head, _, window = label.partition("@")
    strategy, _, variant = head.partition("+")
    return strategy, int(window or PEER_WINDOW), VARIANTS[variant] if variant else {}


ONE_NODE = (
    "sequential",
    "nemo_mffd",
    "verl_kk",
    "verl_dynbsz",
    "hf_rebalance",
    "bcl-rank@16",
    "bcl-rank@32",
    "bcl-node@16",
)
PADDED = (
    "sequential",
    "verl_kk",
    "hf_rebalance",
    "bcl-rank@16",
    "bcl-node@16",
    "bcl-rank+step@16",
    "bcl-node+step@16",
)
"""One node of 8 ranks, padded layout: BCL under both record contracts against the peers."""
FOUR_NODES = (
    "sequential",
    "nemo_mffd",
    "verl_kk",
    "bcl-rank@16",
    "bcl-rank@32",
    "bcl-node@16",
    "bcl-world@16",
    "bcl-node+pooled@16",
)
ABLATION = (
    "sequential",
    "bcl-world@16",
    "bcl-world+no_stratify@16",
    "bcl-world+carry_wb4@16",
    "bcl-world+no_step_fill@16",
    "bcl-world+no_split_shards@16",
    "bcl-world+shard_group_8@16",
    "bcl-world+shard_group_32@16",
    "bcl-rank@32",
    "bcl-rank+no_stratify@32",
    "bcl-rank+carry_wb4@32",
)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and worst corpora against the targets."""
    one, four = result["1node"], result["4node"]
    names = list(one)

    def col(
        table: dict[str, Any], label: str, key: str, subset: list[str] | None = None
    ) -> list[float]:
        return [table[c][label][key] for c in (subset or names) if label in table[c]]

    def med_worst(values: list[float]) -> dict[str, float]:
        return {"median": float(np.median(values)), "worst": float(np.min(values))}

    ordered = [c for c in names if result["kinds"][c] != "iid"]
    # corpora with at least 2 shards per node: smaller ones have every shard cut (one piece per
    # node), so every node reads every shard by design
    sharded = [c for c in names if result["records"][c] >= 2 * 4 * SHARD_RECORDS]
    summary: dict[str, Any] = {
        "rank_w32_cv_reduction": med_worst(col(one, "bcl-rank@32", "cv_reduction")),
        "rank_w32_cv_reduction_ordered": med_worst(
            col(one, "bcl-rank@32", "cv_reduction", ordered)
        ),
        "rank_w32_vs_verl_kk": med_worst(col(one, "bcl-rank@32", "speedup_vs_verl_kk")),
        "world_1node_vs_nemo_mffd": med_worst(col(one, "bcl-node@16", "speedup_vs_nemo_mffd")),
        "world_1node_vs_verl_kk": med_worst(col(one, "bcl-node@16", "speedup_vs_verl_kk")),
        "world_1node_vs_verl_kk_step": med_worst(
            col(one, "bcl-node@16", "speedup_vs_verl_kk_step")
        ),
        "packed_world_vs_hf_rebalance": med_worst(
            col(one, "bcl-node@16", "speedup_vs_hf_rebalance")
        ),
        "packed_rank_w32_vs_hf_rebalance": med_worst(
            col(one, "bcl-rank@32", "speedup_vs_hf_rebalance")
        ),
    }
    padded = result.get("padded", {})
    for label, key in (
        ("bcl-node+step@16", "padded_world_step_vs_hf_rebalance"),
        ("bcl-node@16", "padded_world_pack_vs_hf_rebalance"),
        ("bcl-rank+step@16", "padded_rank_step_vs_hf_rebalance"),
        ("bcl-rank@16", "padded_rank_pack_vs_hf_rebalance"),
        ("verl_kk", "padded_verl_kk_vs_hf_rebalance"),
    ):
        if padded:
            summary[key] = med_worst(col(padded, label, "speedup_vs_hf_rebalance"))
    for label in ("hf_rebalance", "bcl-node@16", "verl_kk"):  # lower is better: worst = max
        values = col(one, label, "imbalance_sq")
        summary[f"1node_{label}_imbalance_sq"] = {
            "median": float(np.median(values)),
            "worst": float(np.max(values)),
        }
    for scope in ("node", "world", "rank") if four else ():
        label = f"bcl-{scope}@16"
        summary[f"4node_{scope}_efficiency"] = med_worst(col(four, label, "efficiency"))
        summary[f"4node_{scope}_efficiency_ordered"] = med_worst(
            col(four, label, "efficiency", ordered)
        )
        summary[f"4node_{scope}_download_amplification_max"] = float(
            np.max(col(four, label, "download_amplification", sharded))
        )
    if four:
        summary["4node_world_vs_nemo_mffd"] = med_worst(
            col(four, "bcl-world@16", "speedup_vs_nemo_mffd")
        )
        summary["4node_world_vs_verl_kk"] = med_worst(
            col(four, "bcl-world@16", "speedup_vs_verl_kk")
        )
        summary["4node_pooled_bound_efficiency"] = med_worst(
            col(four, "bcl-node+pooled@16", "efficiency")
        )
    for peer in ("sequential", *PEERS):
        if four and peer in FOUR_NODES:  # hf_rebalance: 1-node settings only
            summary[f"4node_{peer}_download_amplification_max"] = float(
                np.max(col(four, peer, "download_amplification", sharded))
            )
            summary[f"4node_{peer}_efficiency"] = med_worst(col(four, peer, "efficiency"))
        summary[f"1node_{peer}_efficiency"] = med_worst(col(one, peer, "efficiency"))
    return summary


def markdown(result: dict[str, Any]) -> str:
    """Tables for the README and docs/balance.md."""
    s = result["summary"]
    lines = [
        f"Command: `{result['meta']['command']}` at {str(result['machine']['git_commit'])[:10]} "
        f"({result['machine']['date']}). Corpora: {len(result['kinds'])} "
        f"({sum(k != 'iid' for k in result['kinds'].values())} ordered or real, in write order).",
        "",
        "| figure | median | worst corpus | target |",
        "|---|---|---|---|",
    ]
    rows = [
        (
            "bcl-rank W=32 cross-rank CV reduction, 1 node",
            "rank_w32_cv_reduction",
            ">= 85% / >= 78%",
        ),
        ("  the same, ordered and real corpora only", "rank_w32_cv_reduction_ordered", ""),
        ("bcl-rank W=32 speedup vs verl_kk, 1 node", "rank_w32_vs_verl_kk", ">= 1.0 median"),
        ("bcl-world W=16 speedup vs nemo_mffd, 1 node", "world_1node_vs_nemo_mffd", ">= 1.17"),
        ("bcl-world W=16 speedup vs verl_kk, 1 node", "world_1node_vs_verl_kk", ">= 1.05"),
        ("  the same, one sync per optimizer step", "world_1node_vs_verl_kk_step", ""),
        ("bcl-node W=16 efficiency, 4 nodes x 8", "4node_node_efficiency", ">= 0.97 / >= 0.93"),
        ("bcl-world W=16 efficiency, 4 nodes x 8", "4node_world_efficiency", ">= 0.97 / >= 0.93"),
        ("  the same, ordered and real corpora only", "4node_world_efficiency_ordered", ""),
        ("bcl-rank W=16 efficiency, 4 nodes x 8", "4node_rank_efficiency", ""),
        ("  bound: all 32 ranks as one node (no locality)", "4node_pooled_bound_efficiency", ""),
        ("bcl-world W=16 speedup vs nemo_mffd, 4 nodes", "4node_world_vs_nemo_mffd", ""),
        ("bcl-world W=16 speedup vs verl_kk, 4 nodes", "4node_world_vs_verl_kk", ""),
        ("verl_kk efficiency, 4 nodes", "4node_verl_kk_efficiency", ""),
        ("nemo_mffd efficiency, 4 nodes", "4node_nemo_mffd_efficiency", ""),
        ("sequential efficiency, 4 nodes", "4node_sequential_efficiency", ""),
        (
            "bcl-world W=16 speedup vs hf_rebalance, packed",
            "packed_world_vs_hf_rebalance",
            ">= 1.10 median",
        ),
        ("bcl-rank W=32 speedup vs hf_rebalance, packed", "packed_rank_w32_vs_hf_rebalance", ""),
        *(
            row
            for scope, target in (("world", ">= 1.05 / >= 1.0"), ("rank", ""))
            for row in (
                (
                    f"bcl-{scope}+step W=16 speedup vs hf_rebalance, padded",
                    f"padded_{scope}_step_vs_hf_rebalance",
                    target,
                ),
                (
                    "  the same, exactly B per micro-batch",
                    f"padded_{scope}_pack_vs_hf_rebalance",
                    "",
                ),
            )
        ),
        ("verl_kk speedup vs hf_rebalance, padded", "padded_verl_kk_vs_hf_rebalance", ""),
        (
            "imbalance_sq, hf_rebalance, packed 1 node (lower is better; worst = max)",
            "1node_hf_rebalance_imbalance_sq",
            "",
        ),
        ("imbalance_sq, bcl-world W=16", "1node_bcl-node@16_imbalance_sq", ""),
        ("imbalance_sq, verl_kk", "1node_verl_kk_imbalance_sq", ""),
    ]
    for label, key, target in rows:
        if key not in s:
            continue
        v = s[key]
        pct = "reduction" in key
        fmt = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
        lines.append(f"| {label} | {fmt(v['median'])} | {fmt(v['worst'])} | {target} |")
    lines += (
        []
        if "4node_sequential_download_amplification_max" not in s
        else [
            "",
            "Download amplification, 4 nodes (max over corpora with >= 2 shards per node; smaller "
            "ones have every shard cut, one piece per node): "
            + ", ".join(
                f"{name} {s[f'4node_{name}_download_amplification_max']:.2f}"
                for name in ("sequential", "nemo_mffd", "verl_kk")
            )
            + ", "
            + ", ".join(
                f"bcl-{sc} {s[f'4node_{sc}_download_amplification_max']:.2f}"
                for sc in ("rank", "node", "world")
            ),
            "",
        ]
    )
    for setting, labels in (
        (
            "1node",
            [
                "sequential",
                "nemo_mffd",
                "verl_kk",
                "verl_dynbsz",
                "hf_rebalance",
                "bcl-rank@32",
                "bcl-node@16",
            ],
        ),
        ("padded", list(PADDED)),
        (
            "4node",
            ["sequential", "nemo_mffd", "verl_kk", "bcl-rank@16", "bcl-node@16", "bcl-world@16"],
        ),
    ):
        if not result.get(setting):
            continue
        lines += [
            f"Efficiency per corpus, {setting} ({'4 nodes x 8 ranks' if setting == '4node' else '8 ranks'}):",
            "",
            "| corpus | kind | " + " | ".join(labels) + " |",
            "|---|---|" + "---|" * len(labels),
        ]
        for corpus, row in result.get(setting, {}).items():
            cells = [f"{row[label]['efficiency']:.3f}" if label in row else "" for label in labels]
            lines.append(f"| {corpus} | {result['kinds'][corpus]} | " + " | ".join(cells) + " |")
        lines.append("")
    if result.get("ablation"):
        labels = list(next(iter(result["ablation"].values())))
        lines += [
            "Ablation, 4 nodes x 8 (efficiency; `_step`: one sync per optimizer step):",
            "",
            "| variant | " + " | ".join(result["ablation"]) + " |",
            "|---|" + "---|" * len(result["ablation"]),
        ]
        for label in labels:
            cells = [
                f"{result['ablation'][c][label]['efficiency']:.3f}" for c in result["ablation"]
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plots(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for setting, labels in (
        ("1node", ["sequential", "nemo_mffd", "verl_kk", "bcl-rank@32", "bcl-node@16"]),
        ("4node", ["sequential", "nemo_mffd", "verl_kk", "bcl-rank@16", "bcl-world@16"]),
    ):
        corpora_names = list(result[setting])
        fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(corpora_names)), 4.2))
        width = 0.8 / len(labels)
        x = np.arange(len(corpora_names))
        for i, label in enumerate(labels):
            values = [
                result[setting][c].get(label, {}).get("efficiency", np.nan) for c in corpora_names
            ]
            ax.bar(x + i * width, values, width, label=label)
        ax.set_xticks(x + 0.4 - width / 2, corpora_names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("balance efficiency E")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"Efficiency per corpus, {setting} (write order for ordered/real corpora)")
        ax.legend(fontsize=7, ncol=len(labels))
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{setting}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def provenance(argv: list[str], quick: bool) -> dict[str, Any]:
    """The command and the setting (where and when: the machine stamp beside it)."""
    return {
        "command": " ".join(["python tools/bench_balance.py", *argv]),
        "quick": quick,
        "setting": {"ranks_1node": RANKS, "ranks_4node": 4 * RANKS, "pack_size": PACK,
                    "grad_accum": ACCUM, "max_record_tokens": MAX_RECORD_TOKENS,
                    "cost_model": COST_MODEL, "shard_records": SHARD_RECORDS},
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
    parser = bench_parser(
        __doc__, RESULTS / "bench_balance.json", quick="fewer and smaller corpora"
    )
    parser.add_argument(
        "--settings",
        default="1node,4node,padded,ablation",
        help="comma-separated subset (1node is always run: the summary needs it)",
    )
    args = parser.parse_args(argv)
    settings = set(args.settings.split(",")) | {"1node"}
    n_ordered, n_iid = (200_000, 131_072) if args.quick else (1_000_000, 262_144)
    model = get_preset(COST_MODEL)
    data = corpora(n_ordered, n_iid, args.quick)
    result: dict[str, Any] = {
        "meta": provenance(sys.argv[1:] if argv is None else argv, args.quick),
        "kinds": {name: kind for name, (kind, _) in data.items()},
        "records": {},
        "1node": {},
        "4node": {},
        "padded": {},
        "ablation": {},
    }
    for name, (kind, build) in tqdm(data.items(), desc="corpora", unit="corpus"):
        tok = build()
        result["records"][name] = int(tok.size)
        result["1node"][name] = run_setting(tok, model, RANKS, RANKS, ONE_NODE)
        if "padded" in settings:
            result["padded"][name] = run_setting(tok, model, RANKS, RANKS, PADDED, "padded")
        if "4node" in settings:
            result["4node"][name] = run_setting(tok, model, 4 * RANKS, RANKS, FOUR_NODES)
        if kind != "iid" and "ablation" in settings:
            result["ablation"][name] = run_setting(tok, model, 4 * RANKS, RANKS, ABLATION)
    result["summary"] = summarize(result)
    written = write_result(_rounded(result), args.out)
    text = markdown(written)
    args.out.with_suffix(".md").write_text(text + "\n")
    if "4node" in settings:
        plots(written, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
