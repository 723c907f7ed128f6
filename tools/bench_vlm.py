"""Image-text balance on real image sizes: the two-term cost against token-only balancing.

Records: the images of three public annotation files, each turned into Qwen2-VL patches and image
tokens by the processor's own arithmetic (``bcl_stream.vision.geometry.qwen2_vl``,
transformers' defaults: min_pixels 3136, max_pixels 1,003,520):

- COCO val2017's 5,000 images in the annotation file's own order
  (``bcl_bench/data/coco_val2017_sizes.csv``), split in halves by image order: ``tune`` (the
  first 2,500) and ``held_out`` (the rest);
- TACO's 1,500 photos (``bcl_bench/data/taco_sizes.csv``, 0.4 to 24 megapixels), held out
  whole: added after every choice was made on COCO's tune half;
- MathVista testmini's 1,000 images (``bcl_bench/data/mathvista_testmini_sizes.csv``:
  diagrams, charts, documents and photos, 24 to 5,092 patches), held out whole from the
  window regrouping (added after it was chosen on rows of COCO and TACO), then looked at to
  choose the redeal, the budgeted choice and the window swaps (``planner/two_term.py``).

Text lengths, three workloads:

- ``captions``: each image with its own first caption (the real pairing; captioning data;
  COCO only, TACO and MathVista have no captions);
- ``sft``: image i with record i of the committed stdlib chat corpus
  (``tools/data/stdlib_cl100k_lengths.npy``, cl100k, its own order): instruction data whose
  text is only loosely tied to its image;
- ``mix``: the ``sft`` records, then as many text-only records, this machine's manual pages
  (``bcl_bench.text_corpora``'s ``man`` corpus, capped at 8,192 tokens, in path order), source
  after source as a writer stores them.

Each text source is split in halves too (``tune`` rows take the first, ``held_out`` rows of
every corpus the second); each half repeated end to end to ``--records``. Four choices were
made on COCO's ``tune`` rows only: the two-term refinement's acceptance rule, its weighing
(each max relative to its mean), its swap limit and its start (the token-only plan, with the
capped fallback; ``planner/two_term.py``); every planner setting is the default. A fifth, the
regrouping of a window's micro-batches (``planner/two_term_regroup.py``), was made after
TACO's ``mix`` rows missed their targets, and its three groupings were compared on rows of
both corpora; MathVista's rows, added afterwards, are held out for it. The last two, the
record-level redeal of a window and the choice within each guard unit's budget, were made on
MathVista's rows after they missed, and checked on COCO's and TACO's.

Compared at 1 node x 8 ranks, G = 4, one sync per micro-batch, under the qwen2-vl-7b and
qwen2-vl-2b training-FLOPs presets (``bcl_stream.vision.cost``: the 7B's language model
outweighs its vision tower, the 2B's does not), under the record contract (B = 8) and the token
budget (T = 16,384 tokens, image tokens included):

- ``bcl``: bcl-world balancing the summed two-term cost;
- ``bcl_tokens_only``: the same loader balancing the language model's cost alone
  (c(text + image tokens)), blind to the vision encoder;
- ``bcl_two_term``: the token-only plan after the two-term refinement
  (``planner/two_term.py``, as the readers refine it: windows of W = 16 micro-batches, guard
  units of 16 windows),
  what the readers yield under a two-term cost model, with ``vision_ceiling``: the most vision
  efficiency any exchange of records between the ranks of its micro-batches could reach
  (records are whole);
- ``bcl_two_term_packs_whole``: the refinement without the redeal and the window swaps (a
  micro-batch's records stay together; the candidates of two releases ago, chosen as this
  release chooses);
- ``bcl_two_term_in_place``: without regrouping a window's micro-batches either
  (``planner/two_term_regroup.py``): records stay at their micro-batch index (the candidates
  of the readers' rule before the regrouping); its ``vision_ceiling`` is the one regrouping
  and the redeal lift;
- ``bcl_two_term_free``, ``bcl_two_term_capped``: the swaps alone (free; capped), to weigh
  the rule;
- ``bcl_two_term_slack``: the readers' rule with the guard loosened by :data:`SLACK` (0.1%), as
  the planner knob ``two_term_slack=0.001`` sets it: what a slack on "never below token-only"
  buys, for the owners of that target and the users who set the knob to weigh;
- ``verl_dynbsz``, ``nemo_mffd``: the peers, over expanded tokens (text + image tokens);
- ``sequential``: a plain loader.

Every schedule is scored on both terms (``bcl_stream.analysis.terms``): efficiency of the
vision term, the language term and their sum; modeled time with the vision encoder as its own
stage (sum over micro-batches of max_r vision + max_r language) and as part of one step
(sum of max_r of the sum), both per unit of useful cost, so a strategy that leaves records out
gets no credit for it.

    python tools/bench_vlm.py                 # results/bench_vlm.json and .png
    python tools/bench_vlm.py --records 20000 --workloads sft
"""

from __future__ import annotations

import csv
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_bench import text_corpora
from bcl_bench.harness import (
    RESULTS,
    ROOT,
    bench_parser,
    markdown_table,
    parse_or_print_table,
    write_result,
)
from bcl_stream.analysis.sim import SimConfig, plan_schedules, shard_table
from bcl_stream.analysis.terms import term_figures
from bcl_stream.planner.padded import ragged_pack_costs
from bcl_stream.planner.token_contract import planning_window
from bcl_stream.planner.two_term import GUARD_WINDOWS, ITERATIONS, RULES, refine_two_terms
from bcl_stream.vision.components import RecordComponents
from bcl_stream.vision.cost import get_two_term_preset
from bcl_stream.vision.geometry import qwen2_vl

SIZES = ROOT / "bcl_bench" / "data" / "coco_val2017_sizes.csv"
WIDE_SIZES = ROOT / "bcl_bench" / "data" / "taco_sizes.csv"
SPREAD_SIZES = ROOT / "bcl_bench" / "data" / "mathvista_testmini_sizes.csv"
CORPORA = {"coco": SIZES, "taco": WIDE_SIZES, "mathvista": SPREAD_SIZES}
"""Image sizes: COCO val2017 (tune and held-out halves); TACO and MathVista testmini (each
held out whole)."""
TEXTS = ROOT / "tools" / "data" / "stdlib_cl100k_lengths.npy"
WORKLOADS = ("captions", "sft", "mix")
HALVES = ("tune", "held_out")
T, ACCUM, RANKS, B = 16_384, 4, 8, 8
PEERS = ("verl_dynbsz", "nemo_mffd")
STRATEGIES = (
    "bcl", "bcl_two_term", "bcl_two_term_packs_whole", "bcl_two_term_in_place",
    "bcl_two_term_free", "bcl_two_term_capped", "bcl_two_term_slack",
    "bcl_tokens_only", *PEERS, "sequential",
)  # fmt: skip
COST_MODELS = ("qwen2-vl-7b", "qwen2-vl-2b")
SLACK = 0.001
"""The guard slack ``bcl_two_term_slack`` weighs: what letting each term's sum of maxima end
0.1% above the token-only plan's buys (the readers' default, ``two_term_slack``, is 0)."""
MAN_CAP = 8192


def records(text: npt.NDArray[np.int64], patches: npt.NDArray[np.int64]) -> RecordComponents:
    """One workload's components in write order: ``patches[i]`` the patches of record i's one
    image, 0 for a text-only record; image tokens by the geometry's merge."""
    merge = qwen2_vl().merge_size ** 2
    return RecordComponents.build(
        (int(t), int(p) // merge, [int(p)] if p else []) for t, p in zip(text, patches, strict=True)
    )


def image_sizes(corpus: str = "coco") -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """(patches, caption tokens or None where the corpus has no captions) of every image of
    ``corpus``, in its file's order."""
    geometry = qwen2_vl()
    patches, captions = [], []
    with CORPORA[corpus].open() as fh:
        for row in csv.DictReader(fh):
            patches.append(geometry.patches(int(row["width"]), int(row["height"])))
            if "caption_tokens" in row:
                captions.append(int(row["caption_tokens"]))
    caps = np.asarray(captions, dtype=np.int64) if captions else None
    return np.asarray(patches, dtype=np.int64), caps


def workload(name: str, half: str, n: int, corpus: str = "coco") -> RecordComponents:
    """``n`` records of one workload's half (its records repeated end to end, order kept).
    TACO and MathVista are held out whole (``half`` must be ``held_out``), beside the text
    sources' held-out halves; they have no captions."""
    patches, captions = image_sizes(corpus)
    texts = np.load(TEXTS).astype(np.int64)
    k = patches.size // 2
    part = slice(0, k) if half == "tune" else slice(k, 2 * k)
    if corpus != "coco":
        if half != "held_out" or (captions is None and name == "captions"):
            raise ValueError(f"{corpus} is held out whole and has no captions: {name} {half}")
        part = slice(0, patches.size)
    t_half = texts.size // 2
    text_part = slice(0, t_half) if half == "tune" else slice(t_half, 2 * t_half)
    p = patches[part]
    if name == "captions":
        assert captions is not None
        text = captions[part]
    else:
        text = np.resize(texts[text_part], p.size)
    if name == "mix":  # the manual pages cut where COCO's halves cut them, whatever the corpus
        k = image_sizes("coco")[0].size // 2
        man = np.minimum(text_corpora.build("man", 2 * k, MAN_CAP), MAN_CAP)
        only = man[:k] if half == "tune" else man[k:]
        only = only[: p.size]
        text = np.concatenate([text, only])
        p = np.concatenate([p, np.zeros(only.size, dtype=np.int64)])
    idx = np.resize(np.arange(p.size), n)
    return records(text[idx], p[idx])


def score_all(
    data: RecordComponents, config: SimConfig, cost_model: str
) -> dict[str, dict[str, Any]]:
    """Each strategy's per-term figures on one workload under one setting."""
    model = get_two_term_preset(cost_model)
    vision, language = model.terms(data)
    summed = vision + language
    tok = data.tokens
    planned = {}
    for label, costs, names in (
        ("", summed, ("bcl-world", *PEERS, "sequential")),
        ("tokens_only", language, ("bcl-world",)),
    ):
        table = shard_table(tok, costs, config.shard_records)
        for name, s in plan_schedules(tok, costs, table, config, names).items():
            key = "bcl" if name == "bcl-world" else name
            planned[f"{key}_{label}" if label else key] = s
    budget = config.contract == "tokens"
    window = planning_window(config)  # the readers' unit
    runs = [(rule, 0.0) for rule in RULES] + [("guarded", SLACK)]
    for rule, slack in runs:  # guarded, no slack: what the readers yield
        two = refine_two_terms(
            planned["bcl_tokens_only"].packs,
            vision,
            language,
            config.ranks_per_node,
            tokens=tok if budget else None,
            max_tokens=config.max_tokens if budget else None,
            rule=rule,
            window=window,
            guard_windows=GUARD_WINDOWS,
            slack=slack,
        )
        name = "bcl_two_term" if rule == "guarded" else f"bcl_two_term_{rule}"
        name = f"{name}_slack" if slack else name
        planned[name] = replace(planned["bcl_tokens_only"], packs=two)
    out: dict[str, dict[str, Any]] = {}
    for name in STRATEGIES:
        s = planned[name]
        figures = term_figures(
            s.packs,
            vision,
            language,
            sync=config.sync,
            microbatches_per_step=config.grad_accum,
            step_sizes=s.step_sizes,
        )
        useful = float(ragged_pack_costs(s.packs, summed, "packed").sum())
        counts = [len(rank) for rank in s.packs]
        out[name] = {
            **figures,
            "useful_cost": useful,
            "time_separate_per_cost": figures["time_separate_stages"] / useful,
            "time_one_stage_per_cost": figures["time_one_stage"] / useful,
            "time_balanced_per_cost": figures["time_balanced_stages"] / useful,
            "records_used": s.records_used,
            "records_left": s.records_left,
            "micro_batches_per_rank": {"min": min(counts), "max": max(counts)},
            "vision_ceiling": vision_ceiling(s.packs, vision, config.ranks_per_node),
        }
    return out


def vision_ceiling(packs: Any, vision: npt.NDArray[np.float64], ranks_per_node: int) -> float:
    """The most vision efficiency any exchange of records between a node's ranks at each
    micro-batch index (what the two-term refinement does) could reach on these micro-batches:
    of a micro-batch's n records with a vision cost, some rank holds at least ceil(n / P), so
    its max_r V is at least the sum of the ceil(n / P) smallest, at least its costliest
    record's (records are whole) and at least the mean."""
    mean = bound = 0.0
    for first in range(0, len(packs), ranks_per_node):
        node = packs[first : first + ranks_per_node]
        for t in range(min(len(rank) for rank in node)):
            ids = np.concatenate([np.asarray(rank[t], dtype=np.int64) for rank in node])
            costs = vision[ids[ids >= 0]]
            seen = np.sort(costs[costs > 0])
            share = float(costs.sum()) / ranks_per_node
            mean += share
            whole = float(seen[-1]) if seen.size else 0.0
            bound += max(share, float(seen[: -(-seen.size // ranks_per_node)].sum()), whole)
    return mean / bound if bound > 0 else 1.0


def settings() -> dict[str, SimConfig]:
    """The two settings: the record contract (B = 8) and the token budget T."""
    base = SimConfig(ranks=RANKS, ranks_per_node=RANKS, grad_accum=ACCUM, pack_size=B)
    return {"record_B8": base, f"tokens_T{T}": replace(base, max_tokens=T, contract="tokens")}


def versus(cells: dict[str, dict[str, Any]], me: str) -> dict[str, dict[str, float]]:
    """``me``'s speedup (modeled time per unit of useful cost) over every other strategy, with
    the vision encoder as its own stage and in one step; ``ceiling``: the most any reordering
    of the token-only balancer's micro-batches could gain over it with separate stages (both
    terms perfectly balanced at each micro-batch)."""
    mine = cells[me]
    out = {
        other: {
            "separate_stages": cells[other]["time_separate_per_cost"]
            / mine["time_separate_per_cost"],
            "one_stage": cells[other]["time_one_stage_per_cost"] / mine["time_one_stage_per_cost"],
        }
        for other in STRATEGIES
        if other != me
    }
    tokens_only = cells["bcl_tokens_only"]
    out["ceiling_over_tokens_only"] = {
        "separate_stages": tokens_only["time_separate_per_cost"]
        / tokens_only["time_balanced_per_cost"]
    }
    return out


def describe(data: RecordComponents) -> dict[str, Any]:
    """The workload's shape: records, images, tokens and patches per image."""
    has = data.images_per_record > 0
    p = data.image_patches
    return {
        "records": len(data),
        "records_with_image": int(has.sum()),
        "text_tokens_mean": float(data.text_tokens.mean()),
        "image_tokens_mean_per_image": float(data.image_tokens[has].mean()) if has.any() else 0,
        "patches_per_image": {
            "min": int(p.min()),
            "median": float(np.median(p)),
            "max": int(p.max()),
        }
        if p.size
        else None,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Per workload and setting (held-out half, qwen2-vl-7b): each strategy's vision and
    language efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        r for r in result["rows"] if r["half"] == "held_out" and r["cost_model"] == "qwen2-vl-7b"
    ] or [r for r in result["rows"] if r["half"] == "held_out"]
    per_line = 4
    lines = -(-len(rows) // per_line)
    fig, axes = plt.subplots(lines, per_line, figsize=(3.6 * per_line, 3.6 * lines), squeeze=False)
    for ax in axes.ravel()[len(rows) :]:
        ax.axis("off")
    for ax, row in zip(axes.ravel(), rows, strict=False):
        x = np.arange(len(STRATEGIES))
        cells = row["strategies"]
        vis = [cells[n]["efficiency_vision"] or 0.0 for n in STRATEGIES]
        lang = [cells[n]["efficiency_language"] for n in STRATEGIES]
        ax.bar(x - 0.2, vis, 0.4, label="vision efficiency")
        ax.bar(x + 0.2, lang, 0.4, label="language efficiency")
        ax.set_xticks(x, STRATEGIES, rotation=60, fontsize=7)
        ax.set_ylim(0.0, 1.0)
        corpus = row.get("corpus", "coco")
        ax.set_title(
            f"{row['cost_model']} {corpus} {row['workload']}, {row['setting']}", fontsize=8
        )
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    """The table docs/vlm.md carries: per row, each term's efficiency of bcl_two_term, the
    same with micro-batches kept whole (no redeal), without regrouping either (in place), bcl, the token-only balancer and the best peer, the
    speedups, and the vision ceiling of the in-place micro-batches (what no exchange at one
    micro-batch index passes)."""
    columns = [
        "model", "corpus", "workload", "half", "setting", "two-term: sum / vision / language",
        "packs whole: sum / vision / language", "in place: sum / vision / language",
        "bcl: sum / vision / language",
        "tokens-only: sum / vision / language", "verl_dynbsz: sum / vision / language",
        "two-term vs tokens-only, separate / one stage", "ceiling over tokens-only",
        "in-place vision ceiling",
    ]  # fmt: skip

    def terms(cell: dict[str, Any]) -> str:
        return (
            f"{cell['efficiency_summed']:.3f} / {cell['efficiency_vision']:.3f} / "
            f"{cell['efficiency_language']:.3f}"
        )

    lines = []
    for r in result["rows"]:
        c, vs = r["strategies"], r["bcl_two_term_speedup_vs"]
        lines.append(
            [
                r["cost_model"], r.get("corpus", "coco"), r["workload"], r["half"], r["setting"],
                terms(c["bcl_two_term"]), terms(c["bcl_two_term_packs_whole"]),
                terms(c["bcl_two_term_in_place"]), terms(c["bcl"]),
                terms(c["bcl_tokens_only"]), terms(c["verl_dynbsz"]),
                f"{vs['bcl_tokens_only']['separate_stages']:.3f} / "
                f"{vs['bcl_tokens_only']['one_stage']:.3f}",
                f"{vs['ceiling_over_tokens_only']['separate_stages']:.3f}",
                f"{c['bcl_two_term_in_place']['vision_ceiling']:.3f}",
            ]
        )  # fmt: skip
    return markdown_table(columns, lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_vlm.json")
    parser.add_argument("--records", type=int, default=20_000, help="records per half")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--cost-models", nargs="+", default=list(COST_MODELS), choices=COST_MODELS)
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    args = parse_or_print_table(parser, argv, markdown)
    if args is None:
        return 0
    rows = []
    cells_of = [
        (corpus, name, half)
        for corpus in args.corpora
        for name in args.workloads
        for half in (HALVES if corpus == "coco" else ("held_out",))
        if corpus == "coco" or name != "captions"
    ]
    for cost_model in args.cost_models:
        for corpus, name, half in cells_of:
            data = workload(name, half, args.records, corpus)
            for label, config in settings().items():
                t0 = time.perf_counter()
                cells = score_all(data, config, cost_model)
                rows.append(
                    {
                        "cost_model": cost_model,
                        "corpus": corpus,
                        "workload": name,
                        "half": half,
                        "setting": label,
                        "shape": describe(data),
                        "strategies": cells,
                        "bcl_speedup_vs": versus(cells, "bcl"),
                        "bcl_two_term_speedup_vs": versus(cells, "bcl_two_term"),
                        "seconds": time.perf_counter() - t0,
                    }
                )
                b = cells["bcl_two_term"]
                vs = rows[-1]["bcl_two_term_speedup_vs"]["bcl_tokens_only"]
                print(
                    f"{cost_model} {corpus} {name:8s} {half:8s} {label:13s} two-term eff sum "
                    f"{b['efficiency_summed']:.4f} vision {b['efficiency_vision']:.4f} "
                    f"language {b['efficiency_language']:.4f} | "
                    f"x{vs['separate_stages']:.3f} vs tokens-only (separate stages) "
                    f"({rows[-1]['seconds']:.0f}s)",
                    flush=True,
                )
    result = {
        "settings": {
            "cost_models": args.cost_models,
            "geometry": qwen2_vl().to_dict(),
            "ranks": RANKS,
            "grad_accum": ACCUM,
            "pack_size": B,
            "max_tokens": T,
            "sync": "microbatch",
            "records_per_half": args.records,
            "sizes": {corpus: str(CORPORA[corpus].relative_to(ROOT)) for corpus in args.corpora},
            "texts": "tools/data/stdlib_cl100k_lengths.npy",
            "text_only": f"bcl_bench.text_corpora man, capped at {MAN_CAP}",
            "two_term_iterations": ITERATIONS,
            "two_term_guard_windows": GUARD_WINDOWS,
            "two_term_slack": SLACK,
        },
        "rows": rows,
    }
    write_result(result, Path(args.out), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
