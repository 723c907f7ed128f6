"""``bcl-stream simulate``: score every strategy on a dataset's record lengths.

The lengths come from a costed dataset (``--dataset DIR`` or ``s3://...``: the token counts
of its cost index, with its cost model unless ``--cost-model`` says otherwise), from a
``.npy`` file (``--lengths``): a 1-D integer array, or a dataset's ``bcl_costs.npy`` itself,
or from a mixture (``--stream`` repeated: the epoch's draw, each stream with its cost model).

``--layout padded`` scores the padded layout (a pack costs B x its costliest record) and,
beside it, the packed layout on the same records, so the two can be compared: speedups are
against ``sequential`` in the same layout, ``vs_packed_seq`` against ``sequential`` packed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import numpy as np

from bcl_stream.analysis.plots import plot_step_costs
from bcl_stream.analysis.sim import (
    STRATEGIES,
    Metrics,
    Schedule,
    SimConfig,
    budget_figures,
    efficiencies,
    micro_batch_price,
    plan_schedules,
    score,
    shard_table,
    speedups,
)
from bcl_stream.analysis.terms import TERM_KEYS, term_figures
from bcl_stream.commands.config_options import PLAN_DEFAULTS, add_canonical_options, plan_fields
from bcl_stream.commands.layout_options import add_planner_options, resolve_layout
from bcl_stream.commands.plan import cache_dir, data_source, open_mixture
from bcl_stream.commands.write_options import DEFAULT_COST_MODEL
from bcl_stream.cost import resolve
from bcl_stream.epoch.checks import no_pack_error
from bcl_stream.io.remote import open_cost_index
from bcl_stream.planner.bcl import validate_costs
from bcl_stream.planner.mixture import EpochDraw
from bcl_stream.planner.shard_table import ShardTable, shard_weights
from bcl_stream.process_layout import ProcessLayout
from bcl_stream.vision.components import read_components
from bcl_stream.vision.cost import resolve_two_term, two_term_preset_names

SIM_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig)}
LENGTHS_SHARD_RECORDS = 4096
"""Shard size assumed for a bare array of lengths (a dataset's real shards are used instead)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate balance of every strategy on record lengths")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--dataset", metavar="DIR", help="a costed dataset (directory or s3://): its token counts"
    )
    source.add_argument(
        "--lengths",
        metavar="FILE.npy",
        help="1-D .npy of integer token counts, or a dataset's bcl_costs.npy",
    )
    source.add_argument(
        "--stream",
        action="append",
        metavar="PATH[:proportion=P|repeat=R|choose=N][,cost_model=M]",
        help="a stream of a mixture (repeat the option; docs/mixtures.md): its epoch's draw",
    )
    p.add_argument(
        "--epoch-size",
        type=int,
        default=None,
        help="records per epoch of a mixture given by proportions (default: all streams once)",
    )
    p.add_argument("--cache-dir", default=None, help="local cache for s3:// data")
    add_canonical_options(p)
    add_planner_options(
        p,
        skip=frozenset({"scope"}),  # each bcl-* strategy sets its own scope
        # The job's shape has a scenario default here (plan and read require it); every other
        # planner field keeps PlanConfig's default, as in plan, read and the DataModule.
        defaults={k: SIM_DEFAULTS[k] for k in ("pack_size", "window")},
        world_aliases=("--ranks",),
        world_help=f"data-parallel ranks in all (R; default {SIM_DEFAULTS['ranks']}, or N x P)",
    )
    p.add_argument(
        "--cost-model",
        default=None,
        help="preset name or cost-model JSON (default: the dataset's own with --dataset, "
        f"{DEFAULT_COST_MODEL} with --lengths); with --dataset also a two-term vision-language "
        "model (qwen2-vl-2b, qwen2-vl-7b or its JSON: docs/vlm.md)",
    )
    p.add_argument(
        "--sync",
        choices=["microbatch", "step"],
        default="microbatch",
        help="ranks wait for each other every micro-batch or every optimizer step",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--epoch", type=int, default=0, help="epoch simulated")
    p.add_argument(
        "--overhead", type=float, default=0.0, help="fixed absolute cost per micro-batch"
    )
    p.add_argument(
        "--micro-batch-overhead",
        type=float,
        default=0.0,
        metavar="F",
        help="fixed price per micro-batch as a fraction of the cost of a full-budget "
        "micro-batch of mean-length records (--max-tokens over the mean length), on top of "
        "--overhead",
    )
    p.add_argument(
        "--shard-records",
        type=int,
        default=None,
        help=f"--lengths only: the array is the dataset in write order, cut into shards of K "
        f"records (default: {LENGTHS_SHARD_RECORDS}; --dataset and --stream use their real shards)",
    )
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated list")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--plot", type=Path, default=None, help="PNG of per-step cost across ranks")
    p.set_defaults(run=run)


def load_lengths(path: str) -> np.ndarray:
    """A 1-D integer array of token counts from ``path`` (a dataset's ``bcl_costs.npy``: its
    ``tokens`` field)."""
    try:
        lengths = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--lengths {path}: cannot load a .npy array ({exc})") from exc
    if lengths.dtype.names and "tokens" in lengths.dtype.names:
        lengths = lengths["tokens"]
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"--lengths {path}: need a 1-D integer array, got {lengths.dtype} {lengths.shape}"
        )
    if lengths.size == 0:
        raise ValueError(f"--lengths {path}: the array is empty")
    return lengths


def sim_config(args: argparse.Namespace) -> SimConfig:
    """The simulated setting the options describe (planner fields: PlanConfig's names, and
    PlanConfig's defaults for those not given; the layout by ``resolve_layout``'s rule: the
    same set-up ``plan`` reads)."""
    layout = resolve_layout(
        args, world_option="--ranks", default_world=cast("int", SIM_DEFAULTS["ranks"])
    )
    planner = {**PLAN_DEFAULTS, **plan_fields(args), "ranks_per_node": layout.ranks_per_node}
    shared = {k: v for k, v in planner.items() if k in SimConfig.__slots__}
    if args.shard_records is not None and args.lengths is None:
        raise ValueError(
            "--shard-records applies to --lengths only: a dataset (--dataset, --stream) is "
            "simulated on its own shards"
        )
    return SimConfig(
        ranks=layout.world_size,
        sync=args.sync,
        seed=args.seed,
        epoch=args.epoch,
        overhead=args.overhead,
        micro_batch_overhead=args.micro_batch_overhead,
        shard_records=args.shard_records or LENGTHS_SHARD_RECORDS,
        canonical_ranks=args.canonical_ranks,
        canonical_ranks_per_node=args.canonical_ranks_per_node,
        **shared,
    )


@dataclasses.dataclass(frozen=True)
class SimInput:
    """What is simulated: records in write order, their costs, the shard table, and for a
    mixture its epoch's draw (the pooled peers then shuffle the draw)."""

    lengths: np.ndarray
    costs: np.ndarray
    table: ShardTable
    model: dict[str, Any]
    draw: EpochDraw | None = None
    streams: list[dict[str, Any]] | None = None
    vision: np.ndarray | None = None
    """Per-record vision-encoder costs of image-text data (``costs`` is then vision plus
    language); None: text-only data, ``costs`` is the language model's alone."""

    def language(self) -> np.ndarray:
        """Per-record language-model costs: ``costs`` less the vision term."""
        return self.costs if self.vision is None else self.costs - self.vision


def sim_input(args: argparse.Namespace, config: SimConfig) -> SimInput:
    """The records the options name: ``--dataset``, ``--lengths`` or ``--stream``s."""
    if args.stream is not None:
        mixture = open_mixture(args, data_source(args)[1] or [])
        model = None if args.cost_model is None else resolve(args.cost_model)
        draw = mixture.draw(config.seed, config.epoch)
        drawn = draw.per_stream()
        costs = mixture.costs(model)
        return SimInput(
            np.asarray(mixture.tokens[:], dtype=np.int64),
            np.asarray(costs[:], dtype=np.float64),
            mixture.shard_table(costs),
            {"streams": [None if m is None else m.to_dict() for m in mixture.stream_models(model)]},
            draw,
            [
                {**d, "records_drawn": int(n)}
                for d, n in zip(mixture.describe(), drawn, strict=True)
            ],
        )
    if args.epoch_size is not None:
        raise ValueError("--epoch-size applies to a mixture (--stream) only")
    if args.dataset is not None:
        return dataset_input(args.dataset, cache_dir(args, args.dataset), args.cost_model)
    lengths, model = load_lengths(args.lengths), resolve(args.cost_model or DEFAULT_COST_MODEL)
    if np.any(lengths < 0):
        raise ValueError(f"token counts must be >= 0; found {int(lengths.min())}")
    costs = validate_costs(model.cost(lengths))
    table = shard_table(lengths, costs, config.shard_records)
    return SimInput(np.asarray(lengths, dtype=np.int64), costs, table, model.to_dict())


def dataset_input(location: str, cache: str | None, cost_model: str | None) -> SimInput:
    """A costed dataset as ``plan`` reads it (its cost index only, no shard read): the same
    costs (the stored ones, or recomputed under ``cost_model``) and its real shard table, so
    ``simulate --dataset`` and ``plan`` plan the same epoch from the same flags.

    A two-term ``cost_model`` (``bcl_stream.vision.cost``) on image-text data (components
    stored beside the index) costs each record vision plus language and reports both terms;
    on text-only data it is its language term. Image-text data under a single-term model has
    no modeled vision term (``efficiency_vision`` null, said in ``cost_model``)."""
    index, root = open_cost_index(location, cache)
    if not len(index):
        raise ValueError(f"--dataset {location}: the dataset holds no records")
    tokens = index.tokens.astype(np.int64)
    components = read_components(root, tokens)  # open_cost_index fetched a remote copy
    counts = index.shard_counts
    two_term = resolve_two_term(cost_model)
    vision = None
    if two_term is None:
        model = index.cost_model if cost_model is None else resolve(cost_model)
        costs = index.costs(model)
        described = model.to_dict()
        if components is not None:
            described["vision_term"] = (
                "not modeled: pass a two-term --cost-model "
                f"({', '.join(two_term_preset_names())} or its JSON) to cost the images"
            )
    elif components is None:
        costs = validate_costs(two_term.language.cost(tokens))
        described = {**two_term.to_dict(), "vision_term": "none: text-only data"}
    else:
        vision, language = two_term.terms(components)
        costs = validate_costs(vision + language)
        described = two_term.to_dict()
    table = ShardTable.build(counts, weight=shard_weights(counts, costs))
    return SimInput(tokens, costs, table, described, vision=vision)


def refuse_empty(label: str, config: SimConfig, data: SimInput, scored: dict[str, Metrics]) -> None:
    """Refuse, like ``plan`` and ``read``, a set-up in which a strategy has no pack at all: its
    metrics would be NaN and nothing would train."""
    empty = [name for name, m in scored.items() if m.packs_per_rank == 0]
    if not empty:
        return
    m = scored[empty[0]]
    left = {"not in a pack": m.records_left} if m.records_left else {}
    fix, what = "Lower --pack-size or --ranks, or use more data", "no pack for any rank"
    if len(empty) < len(scored):
        fix += f" (or leave {', '.join(empty)} out of --strategies)"
        what += f" under {', '.join(empty)}"
    raise no_pack_error(
        label,
        config.epoch,
        sim_records(data),
        left,
        config.ranks,
        config.pack_size,
        fix + ".",
        what,
    )


def sim_records(data: SimInput) -> int:
    """Records simulated (a mixture: its epoch's draw)."""
    return int(data.lengths.size if data.draw is None else data.draw.usable.sum())


def run(args: argparse.Namespace) -> int:
    config = sim_config(args)
    names = tuple(s for s in args.strategies.split(",") if s)
    data = sim_input(args, config)
    table = data.table
    terms = None if data.vision is None else (data.vision, data.language())
    planned = plan_schedules(data.lengths, data.costs, table, config, names, data.draw, terms)
    price = micro_batch_price(data.lengths, data.costs, config)
    layouts = {config.layout: (planned, score(planned, config, table, price))}
    if config.layout == "padded":
        packed = dataclasses.replace(config, layout="packed")
        packed_plans = plan_schedules(
            data.lengths, data.costs, table, packed, names, data.draw, terms
        )
        layouts = {"packed": (packed_plans, score(packed_plans, packed, table, price)), **layouts}
    results = layouts[config.layout][1]
    refuse_empty(args.dataset or args.lengths or ",".join(args.stream), config, data, results)
    node_layout = ProcessLayout(world_size=config.ranks, ranks_per_node=config.ranks_per_node)
    if args.plot is not None:
        plot_step_costs({name: s.pack_costs for name, s in planned.items()}, args.plot)
    if args.json:
        versus = speedups(planned, config, price=price)  # per unit of cost, over the real peers
        payload = _json_payload(args, config, data, node_layout, versus, layouts)
        print(json.dumps(_finite(payload), allow_nan=False))
        return 0
    print(
        f"records {sim_records(data)} in {len(table.counts)} shards; "
        f"node layout: {node_layout.text()}; B={config.pack_size}, "
        f"W={config.window}, G={config.grad_accum}, sync {config.sync}"
    )
    packed_seq = layouts["packed"][1].get("sequential") if len(layouts) > 1 else None
    for layout, (plans, scored) in layouts.items():
        if len(layouts) > 1:
            print(f"layout {layout}")
        print_table(
            scored, efficiencies(plans, config), speedups(plans, config, price=price), packed_seq
        )
    print(
        f"eff/mb: balance efficiency per micro-batch (ranks wait for the slowest at each "
        f"micro-batch, as FSDP does); eff/step: per optimizer step of G={config.grad_accum} "
        f"micro-batches (DDP waits once per step); cv_ranks, cv_time and speedup are "
        f"{EFFICIENCY_IS[config.sync]} (--sync {config.sync})"
    )
    return 0


def _json_payload(
    args: argparse.Namespace,
    config: SimConfig,
    data: SimInput,
    node_layout: ProcessLayout,
    versus: dict[str, Any],
    layouts: dict[str, tuple[dict[str, Schedule], dict[str, Metrics]]],
) -> dict[str, Any]:
    """``simulate --json``'s document: the settings, per strategy its metrics, labelled
    efficiencies, per-term efficiencies and token-budget figures, and the speedups over the
    peers (``versus``) where there are any."""
    settings = {key: getattr(config, key) for key in SimConfig.__slots__}
    if args.lengths is None:
        settings["shard_records"] = None  # the data's own shards
    planned, results = layouts[config.layout]
    payload: dict[str, Any] = {
        "config": {
            **settings,
            "cost_model": data.model,
            "records": sim_records(data),
            "shards": len(data.table.counts),
            "nodes": node_layout.nodes,
            "node_layout": node_layout.text(),
        },
        "efficiency_is": EFFICIENCY_IS[config.sync],
        "strategies": _rows(planned, results, config, data, config.layout),
    }
    if data.streams is not None:
        payload["streams"] = data.streams
    if any(versus.values()):
        payload["speedup_vs"] = versus
    if len(layouts) > 1:
        payload["layouts"] = {
            layout: _rows(plans, scored, config, data, layout)
            for layout, (plans, scored) in layouts.items()
        }
    return payload


def _rows(
    plans: dict[str, Schedule],
    scored: dict[str, Metrics],
    config: SimConfig,
    data: SimInput,
    layout: str,
) -> dict[str, Any]:
    """Each strategy's metrics, its labelled efficiencies (``efficiencies``), its per-term
    efficiencies (``efficiency_vision``, None for text-only data, and ``efficiency_language``;
    ``analysis/terms.py``) and its token-budget figures (``budget_figures``)."""
    both = efficiencies(plans, config)
    rows: dict[str, Any] = {}
    for name, m in scored.items():
        s = plans[name]
        figures = term_figures(
            s.packs,
            data.vision,
            data.language(),
            layout=layout,
            sync=config.sync,
            microbatches_per_step=config.grad_accum,
            step_sizes=s.step_sizes,
        )
        rows[name] = {
            **m.to_dict(),
            **both[name],
            **{key: figures[key] for key in TERM_KEYS},
            **budget_figures(s, data.lengths),
        }
    return rows


def _finite(value: Any) -> Any:
    """NaN and infinities (a metric of a strategy with no pack) as null: strict JSON."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


EFFICIENCY_IS = {"microbatch": "per micro-batch", "step": "per optimizer step"}
"""What ``efficiency`` (and the other metrics) in ``simulate --json`` is, by ``--sync``."""


def print_table(
    results: dict[str, Metrics],
    labelled: dict[str, dict[str, float]],
    versus: dict[str, dict[str, float]],
    packed_seq: Metrics | None,
) -> None:
    """One row per strategy; ``waste`` and ``vs_packed_seq`` only when layouts are compared."""
    base = results.get("sequential")
    peers = sorted({p for v in versus.values() for p in v}, key=list(STRATEGIES).index)
    extra = f"{'waste':>7}{'vs_packed_seq':>14}" if packed_seq else ""
    print(
        f"{'strategy':<18}{'eff/mb':>8}{'eff/step':>9}{'cv_ranks':>10}{'cv_time':>9}{'speedup':>9}"
        f"{'packs':>7}{'left':>7}{'dl_amp':>8}{'shards':>8}{'imb_sq':>8}"
        + "".join(f"{'vs ' + p:>16}" for p in peers)
        + extra
    )
    for name, m in results.items():
        speed = base.time / m.time if base and m.time else float("nan")
        row = (
            f"{name:<18}{labelled[name]['efficiency_per_micro_batch']:>8.3f}"
            f"{labelled[name]['efficiency_per_step']:>9.3f}{m.cv_ranks:>10.3f}{m.cv_time:>9.3f}"
            f"{speed:>9.3f}{m.packs_per_rank:>7}{m.records_left:>7}"
            f"{m.download_amplification:>8.2f}{m.shard_working_set:>8}{m.imbalance_sq:>8.3f}"
            + "".join(f"{versus[name][p]:>16.3f}" for p in peers)
        )
        if packed_seq:
            vs = packed_seq.time / m.time if m.time else float("nan")
            row += f"{m.padding_waste:>7.3f}{vs:>14.3f}"
        print(row)
