"""Mixture benchmark: four ordered sources mixed 0.4/0.3/0.2/0.1, one 6x costlier per record.

What it measures (JSON + PNG under ``results/``):
- **proportions**: each stream's share of the epoch (target: within 0.5 points of the request)
  and inside every window of W*B*R records (every rank's next W packs; target: within 2 points);
- **balance** per scope (rank / node / world at 8 ranks, world at 4 nodes x 8) against
  ``sequential`` over the same mixture, the real peers (NeMo-RL's MFFD, verl's KK balancer, on a
  global shuffle of the same epoch draw) and each source alone at the same scope (target: the
  mixture at least as good as its best single source);
- **planning cost**: seconds per epoch plan and records per second.

The sources are length-sorted (datasets are written sorted or grouped; i.i.d. samples hide
the hard case) and of equal size (300K records each, 4096-record shards), so the weights make
the chat source repeat 1.6x and the code and long sources draw a subset every epoch: every
kind of sampling is exercised. The ``long`` source costs 6x per record (a multimodal or
long-context source: its own cost model, as a mixture stream may have).

    python tools/bench_mixture.py            # ~3 minutes on 2 cores
    python tools/bench_mixture.py --quick    # 60K records per source
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_bench.corpora import PROFILES
from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_stream.analysis.sim import SimConfig, plan_schedules, score
from bcl_stream.cost import CostModel, get_preset
from bcl_stream.epoch.mixture_index import SegmentArray
from bcl_stream.planner import ShardTable, shard_weights
from bcl_stream.planner.mixture import MixtureLayout, choose_counts

MIXES = {  # name -> sources: (name, length profile, proportion, cost factor per record)
    # An image-text source: short captions/questions, each record carrying image tokens that
    # make it cost 6x a text record of its length (its own cost model).
    "main": (
        ("chat", "sharegpt", 0.4, 1.0),
        ("math", "gsm8k", 0.3, 1.0),
        ("code", "evol_code", 0.2, 1.0),
        ("vision", "metamath", 0.1, 6.0),
    ),
    # Stress: the 6x source also has a heavy tail (real chats with pasted documents), so its
    # longest records cost more than a whole pack of the others.
    "stress": (
        ("chat", "sharegpt", 0.4, 1.0),
        ("math", "gsm8k", 0.3, 1.0),
        ("code", "evol_code", 0.2, 1.0),
        ("long", "lmsys_chat", 0.1, 6.0),
    ),
}
SOURCES = MIXES["main"]
SHARD_RECORDS = 4096
MAX_RECORD_TOKENS = 8192
PEERS = ("nemo_mffd", "verl_kk")
SETTINGS = (  # label, ranks, ranks per node, scope
    ("rank", 8, 8, "rank"),
    ("node", 8, 8, "node"),
    ("world", 8, 8, "world"),
    ("world 4x8", 32, 8, "world"),
)
TARGETS = {"epoch_share_error_max": 0.005, "window_share_error_max": 0.02}


def scaled(model: CostModel, factor: float) -> CostModel:
    """``model`` times ``factor`` per record (a costlier modality)."""
    return replace(model, name=f"{model.name}x{factor:g}", a=model.a * factor,
                   b=model.b * factor, k=model.k * factor)  # fmt: skip


def build(n: int, sources: tuple[tuple[str, str, float, float], ...]) -> dict[str, Any]:
    base = get_preset("llama3-8b")
    tokens = [
        np.sort(PROFILES[p](n, i, max_tokens=MAX_RECORD_TOKENS)).astype(np.int64)
        for i, (_, p, _, _) in enumerate(sources)
    ]
    models = [scaled(base, f) if f != 1.0 else base for *_, f in sources]
    costs = [m.cost(t) for m, t in zip(models, tokens, strict=True)]
    counts = [
        np.array(
            [SHARD_RECORDS] * (n // SHARD_RECORDS)
            + ([n % SHARD_RECORDS] if n % SHARD_RECORDS else [])
        )
        for _ in sources
    ]
    choose = choose_counts(
        [n] * len(sources),
        proportion=[p for _, _, p, _ in sources],
        repeat=[None] * len(sources),
        choose=[None] * len(sources),
    )
    layout = MixtureLayout.build(counts, choose)
    weights = [shard_weights(c, x) for c, x in zip(counts, costs, strict=True)]
    return {
        "tokens": tokens,
        "costs": costs,
        "counts": counts,
        "layout": layout,
        "table": layout.table(weights),
        "weights": weights,
        "all_tokens": SegmentArray(layout, tokens)[:],
        "all_costs": SegmentArray(layout, costs)[:],
    }


def shares(layout: MixtureLayout, packs: npt.NDArray[np.int64], window: int) -> dict[str, Any]:
    """Epoch shares and the worst share error over windows of W packs x every rank."""
    want = layout.choose / layout.choose.sum()
    streams = layout.stream_of(packs)  # (R, n_packs, B)
    epoch = np.bincount(streams.ravel(), minlength=layout.n_streams) / streams.size
    worst = np.zeros(layout.n_streams)
    for k in range(streams.shape[1] // window):
        w = streams[:, k * window : (k + 1) * window].ravel()
        got = np.bincount(w, minlength=layout.n_streams) / w.size
        worst = np.maximum(worst, np.abs(got - want))
    return {
        "requested": want.round(4).tolist(),
        "epoch": epoch.round(4).tolist(),
        "epoch_error_max": float(np.abs(epoch - want).max()),
        "window_error_max": float(worst.max()),
        "window_error_per_stream": worst.round(4).tolist(),
    }


def amplification(layout: MixtureLayout, packs: Any, per_node: int) -> float:
    """Download amplification over the streams' real shards (a repeated stream's copies of a
    shard are one shard): sum over nodes of shards read / distinct shards read."""
    seen: list[set[tuple[int, int]]] = []
    for node in range(len(packs) // per_node):
        ranks = packs[node * per_node : (node + 1) * per_node]
        ids = np.concatenate([np.concatenate([np.ravel(b) for b in r] or [[]]) for r in ranks])
        ids = ids.astype(np.int64)
        stream, local = layout.locate(ids)
        seen.append(set(zip(stream.tolist(), (local // SHARD_RECORDS).tolist(), strict=True)))
    return sum(len(s) for s in seen) / len(set().union(*seen))


def copies_dealt_freely(
    data: dict[str, Any], config: SimConfig, bcl: str, draw: Any, per_node: int
) -> dict[str, float]:
    """The same plan with a repeated stream's copies of a shard dealt to nodes on their own
    (no ``ShardTable.origin``): what keeping each shard on one node costs in balance, and
    saves in downloads."""
    free = replace(data["table"], origin=None)
    planned = plan_schedules(data["all_tokens"], data["all_costs"], free, config, (bcl,), draw)
    return {
        "efficiency": score(planned, config)[bcl].efficiency,
        "download_amplification": amplification(data["layout"], planned[bcl].packs, per_node),
    }


def run(
    n: int, window: int, seed: int, sources: tuple[tuple[str, str, float, float], ...]
) -> dict[str, Any]:
    data = build(n, sources)
    layout: MixtureLayout = data["layout"]
    out: dict[str, Any] = {
        "sources": [
            {
                "name": s,
                "profile": p,
                "proportion": w,
                "cost_factor": f,
                "records": n,
                "records_per_epoch": int(c),
                "copies": int(k),
            }
            for (s, p, w, f), c, k in zip(sources, layout.choose, layout.copies, strict=True)
        ],
        "window": window,
        "settings": {},
    }
    for label, ranks, per_node, scope in SETTINGS:
        config = SimConfig(ranks=ranks, ranks_per_node=per_node, window=window, seed=seed,
                           shard_records=SHARD_RECORDS, max_tokens=None)  # fmt: skip
        strategies = ("sequential", f"bcl-{scope}", *PEERS)
        draw = layout.draw(seed, 0)
        started = time.perf_counter()
        planned = plan_schedules(
            data["all_tokens"], data["all_costs"], data["table"], config, strategies, draw
        )
        elapsed = time.perf_counter() - started
        metrics = score(planned, config)
        bcl = f"bcl-{scope}"
        t0 = time.perf_counter()
        plan_schedules(data["all_tokens"], data["all_costs"], data["table"], config, (bcl,), draw)
        plan_s = time.perf_counter() - t0
        per_cost = {k: metrics[k].time / float(planned[k].pack_costs.sum()) for k in planned}
        singles = {}
        for s, (name, *_rest) in enumerate(sources):
            table = ShardTable.build(data["counts"][s], weight=data["weights"][s])
            one = plan_schedules(data["tokens"][s], data["costs"][s], table, config, (bcl,))
            singles[name] = score(one, config)[bcl].efficiency
        out["settings"][label] = {
            "ranks": ranks,
            "ranks_per_node": per_node,
            "efficiency": {k: m.efficiency for k, m in metrics.items()},
            "cv_ranks": {k: m.cv_ranks for k, m in metrics.items()},
            "speedup_vs": {p: per_cost[p] / per_cost[bcl] for p in ("sequential", *PEERS)},
            "single_source_efficiency": singles,
            "best_single_source": max(singles.values()),
            "worst_single_source": min(singles.values()),
            "mixture_vs_best_single": metrics[bcl].efficiency - max(singles.values()),
            "shares": shares(layout, np.asarray(planned[bcl].packs), window),
            "download_amplification": {
                k: amplification(layout, planned[k].packs, per_node) for k in planned
            },
            "copies_dealt_freely": copies_dealt_freely(data, config, bcl, draw, per_node),
            "plan_seconds": plan_s,
            "records_per_second": float(draw.usable.sum()) / plan_s,
            "all_strategies_seconds": elapsed,
        }
    # Resampling across epochs: every record of a subsampled stream is drawn once before any
    # is drawn twice (cyclic draws), measured over the epochs one full cycle takes.
    cover = {}
    for s, (name, *_rest) in enumerate(sources):
        per_epoch = int(layout.choose[s]) % n or n
        epochs = -(-n // per_epoch)
        seen = np.zeros(layout.n_records, dtype=np.int64)
        for e in range(epochs):
            seen += layout.draw(seed, e)(np.arange(layout.n_records))
        _, local = layout.locate(np.arange(layout.n_records))
        streams = layout.stream_of(np.arange(layout.n_records))
        draws = np.bincount(local[streams == s], weights=seen[streams == s], minlength=n)
        cover[name] = {
            "epochs": epochs,
            "min_draws": int(draws.min()),
            "max_draws": int(draws.max()),
        }
    out["coverage"] = cover
    return out


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    settings = result["settings"]
    return {
        "efficiency": {
            k: {name: round(v, 4) for name, v in s["efficiency"].items()}
            for k, s in settings.items()
        },
        "best_single_source": {k: round(s["best_single_source"], 4) for k, s in settings.items()},
        "worst_single_source": {k: round(s["worst_single_source"], 4) for k, s in settings.items()},
        "epoch_share_error_max": max(s["shares"]["epoch_error_max"] for s in settings.values()),
        "window_share_error_max": max(s["shares"]["window_error_max"] for s in settings.values()),
        "mixture_vs_best_single": {k: s["mixture_vs_best_single"] for k, s in settings.items()},
        "download_amplification": {
            k: {name: round(v, 3) for name, v in s["download_amplification"].items()}
            for k, s in settings.items()
        },
        "copies_dealt_freely": {k: s["copies_dealt_freely"] for k, s in settings.items()},
        "speedup_vs": {k: s["speedup_vs"] for k, s in settings.items()},
        "targets": TARGETS,
    }


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["settings"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    kinds = ["sequential", "nemo_mffd", "verl_kk", "bcl", "best single source (bcl)"]
    width = 0.16
    for i, kind in enumerate(kinds):
        values = []
        for label in labels:
            s = result["settings"][label]
            if kind == "bcl":
                values.append(next(v for k, v in s["efficiency"].items() if k.startswith("bcl-")))
            elif kind.startswith("best"):
                values.append(s["best_single_source"])
            else:
                values.append(s["efficiency"][kind])
        axes[0].bar(np.arange(len(labels)) + (i - 2) * width, values, width, label=kind)
    axes[0].set_xticks(range(len(labels)), labels)
    axes[0].set_ylabel("balance efficiency")
    axes[0].set_ylim(0.5, 1.0)
    axes[0].legend(fontsize=8)
    axes[0].set_title(title, fontsize=9)
    for label in labels:
        errs = result["settings"][label]["shares"]["window_error_per_stream"]
        axes[1].plot([s["name"] for s in result["sources"]], errs, marker="o", label=label)
    axes[1].axhline(0.02, color="red", linestyle="--", label="target 0.02")
    axes[1].set_ylabel("worst share error in a W*B*R window")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_mixture.json", quick="60K records per source")
    parser.add_argument("--records", type=int, default=None, help="records per source")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n = args.records or (60_000 if args.quick else 300_000)
    results = {}
    for mix, sources in MIXES.items():
        result = run(n, args.window, args.seed, sources)
        result["summary"] = summarize(result)
        results[mix] = result
        names = "/".join(
            f"{s}:{w}{'x' + format(f, 'g') if f != 1 else ''}" for s, _, w, f in sources
        )
        png = args.out.with_name(f"{args.out.stem}_{mix}.png")
        plot(result, png, f"mixture '{mix}' {names} (sorted sources)")
        print(f"== {mix}: {names}")
        print(json.dumps(result["summary"], indent=1))
    write_result(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
