"""``bcl-stream plan``: every rank's packs of one epoch, computed from the cost index alone.

This is exactly the plan the readers follow (``bcl_stream.epoch.full_plan.full_plan``), so it
can be diffed against ``bcl-stream read`` and inspected without touching any shard.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.metrics import metrics_from_costs
from bcl_stream.commands.config_options import add_canonical_options, plan_fields
from bcl_stream.commands.layout_options import add_planner_options, resolve_layout
from bcl_stream.epoch.checks import require_packs
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.mixture_index import MixtureIndex, StreamSpec
from bcl_stream.epoch.plan import (
    PACKINGS,
    EpochPlan,
    PlanData,
    ReaderConfig,
    epoch_draw,
    epoch_records,
)
from bcl_stream.epoch.stream_report import stream_report
from bcl_stream.epoch.terms import record_costs
from bcl_stream.io.remote import is_remote, open_cost_index
from bcl_stream.planner.padded import ragged_pack_costs
from bcl_stream.process_layout import ProcessLayout


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``read``: the dataset and everything that decides a plan
    (the ranks and nodes: ``commands/layout_options.py``; every other PlanConfig field,
    generated: ``commands/config_options.py``)."""
    p.add_argument(
        "location",
        metavar="DIR",
        nargs="?",
        default=None,
        help="dataset root: a directory or s3://bucket/path (or give --stream, repeated)",
    )
    add_stream_options(p)
    add_planner_options(p)
    p.add_argument(
        "--packing",
        choices=PACKINGS,
        default="bcl",
        help="bcl (balanced packs) or sequential (the plain-loader baseline, same epoch order)",
    )
    add_canonical_options(p)
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--epoch", type=int, default=0, help="epoch to plan (its order depends on it)")
    p.add_argument("--cost-model", default=None, help="recompute costs: preset or JSON file")
    p.add_argument("--cache-dir", default=None, help="local cache for remote datasets")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """``--stream`` (repeated) and ``--epoch-size``: a mixture instead of one dataset."""
    p.add_argument(
        "--stream",
        action="append",
        default=None,
        metavar="PATH[:proportion=P|repeat=R|choose=N][,cost_model=M]",
        help="a stream of a mixture (repeat the option; docs/mixtures.md), instead of DIR",
    )
    p.add_argument(
        "--epoch-size",
        type=int,
        default=None,
        help="records per epoch of a mixture given by proportions (default: all streams once)",
    )


def data_source(args: argparse.Namespace) -> tuple[str | None, list[Any] | None]:
    """(DIR, None) or (None, the ``--stream`` specs): exactly one, ``--epoch-size`` with streams
    only. Every command that takes a dataset or a mixture checks its options here."""
    location = getattr(args, "location", None)
    if (location is None) == (args.stream is None):
        raise ValueError("give a dataset DIR or --stream (repeated) for a mixture, not both")
    if args.stream is None:
        if args.epoch_size is not None:
            raise ValueError("--epoch-size applies to a mixture (--stream) only")
        return location, None
    return None, [StreamSpec.parse(text) for text in args.stream]


def open_mixture(args: argparse.Namespace, specs: list[Any]) -> Any:
    """The ``MixtureIndex`` of ``specs`` (their cost indexes only; remote streams cache under
    ``<cache-dir>/stream-<i>``)."""
    root = cache_dir(args, *(spec.path for spec in specs))
    indexes = [
        open_cost_index(spec.path, None if root is None else f"{root}/stream-{i}")[0]
        for i, spec in enumerate(specs)
    ]
    return MixtureIndex(specs, indexes, epoch_size=args.epoch_size)


def open_plan_data(args: argparse.Namespace) -> tuple[PlanData, str]:
    """The cost index (one dataset) or the mixture the options name, and a label for messages."""
    location, specs = data_source(args)
    if specs is None:
        assert location is not None
        index, _ = open_cost_index(location, cache_dir(args, location))
        return index, location
    mixture = open_mixture(args, specs)
    return mixture, ",".join(spec.path for spec in specs)


def config_from_args(args: argparse.Namespace) -> ReaderConfig:
    """The reader config the options describe (the layout by ``resolve_layout``'s rule)."""
    layout = resolve_layout(args)
    return ReaderConfig.build(
        world_size=layout.world_size,
        ranks_per_node=layout.ranks_per_node,
        seed=args.seed,
        cost_model=args.cost_model,
        packing=args.packing,
        canonical_ranks=args.canonical_ranks,
        canonical_ranks_per_node=args.canonical_ranks_per_node,
        **plan_fields(args),
    )


def cache_dir(args: argparse.Namespace, *locations: str) -> str | None:
    """``--cache-dir``, or a temporary one when any of ``locations`` is remote."""
    if args.cache_dir is None and any(is_remote(place) for place in locations):
        args.cache_dir = tempfile.mkdtemp(prefix="bcl_cache_")
    return str(args.cache_dir) if args.cache_dir is not None else None


def remainder_json(plan: EpochPlan) -> dict[str, Any]:
    """``{"count", "reason", "by_reason"}``; ``reason`` joins the reasons with "; "."""
    counts = plan.remainder_counts()
    return {
        "count": sum(counts.values()),
        "reason": "; ".join(sorted(counts)) if counts else "none",
        "by_reason": counts,
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="print every rank's packs of one epoch (from the index)")
    add_plan_options(p)
    p.set_defaults(run=run)


def pack_json(index: PlanData, packs: Any) -> Any:
    """Packs as JSON lists: record ids, or for a mixture [stream, record id] pairs (what
    ``read`` prints too, so the two can be diffed)."""
    if packs.size and int(packs.min()) < 0:  # the tokens contract's padding
        return [pack_json(index, row[row >= 0][None, :])[0] for row in packs]
    if not isinstance(index, MixtureIndex):
        return packs.tolist()
    stream, local = index.locate(packs)
    return [
        [[s, i] for s, i in zip(srow, irow, strict=True)]
        for srow, irow in zip(stream.tolist(), local.tolist(), strict=True)
    ]


def n_shards(index: PlanData) -> int:
    """Shard files the plan reads (a mixture: its streams' together)."""
    if isinstance(index, MixtureIndex):
        return sum(len(ix.shards) for ix in index.indexes)
    return len(index.shards)


def summary(index: PlanData, config: ReaderConfig, plan: EpochPlan) -> dict[str, Any]:
    """Every figure ``plan`` prints, as ``plan --json`` carries them: the set-up (the layout:
    ranks, nodes, ranks per node and its words; pack size, window, scope), records and shards, packs per rank and the
    balance of the packs under the same metric ``simulate`` reports (``analysis.sim``), per
    micro-batch (``efficiency``, also ``efficiency_per_micro_batch``: every rank waits for the
    slowest at each micro-batch, as FSDP does) and per optimizer step
    (``efficiency_per_step``: micro-batch costs summed over each step's
    ``micro_batches_per_step``, as DDP without a sync inside the accumulation waits; a last
    partial step is left out)."""
    pc = config.plan
    # The costs the planner balanced (a mixture: a view that indexes like an array).
    costs = cast("npt.NDArray[np.float64]", record_costs(index, config.cost_model))
    pack_costs = ragged_pack_costs(plan.plan.packs, costs, pc.layout)
    used, left = plan.plan.records_used, plan.plan.records_left
    metrics = metrics_from_costs(pack_costs, used, left)
    per_step = config.micro_batches_per_step
    step = metrics_from_costs(pack_costs, used, left, microbatches_per_step=per_step, sync="step")
    return {
        "records": epoch_records(index, epoch_draw(index, config, plan.epoch)),
        "shards": n_shards(index),
        **ProcessLayout.of_plan(pc).to_json(),
        "pack_size": pc.pack_size,
        "window": pc.window,
        "scope": pc.scope,
        "packing": config.packing,
        "epoch": plan.epoch,
        "packs_per_rank": plan.n_packs,
        "canonical_ranks": config.canonical_ranks,
        "efficiency": metrics.efficiency,  # per micro-batch (kept for readers of 'efficiency')
        "efficiency_per_micro_batch": metrics.efficiency,
        "efficiency_per_step": step.efficiency,
        "micro_batches_per_step": per_step,
        "cv_ranks": metrics.cv_ranks,
        "records_used": plan.plan.records_used,
    }


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    index, location = open_plan_data(args)
    plan = full_plan(index, config, args.epoch)
    require_packs(location, plan, config, len(index))
    streams = stream_report(index, config, plan)
    figures = summary(index, config, plan)
    remainder = remainder_json(plan)
    if args.json:
        ranks = [
            {"rank": r, "packs": pack_json(index, plan.rank_packs(r))}
            for r in range(config.plan.world_size)
        ]
        out: dict[str, Any] = {**figures, "ranks": ranks, "remainder": remainder}
        if streams is not None:
            out["streams"] = streams
        print(json.dumps(out))
        return 0
    print(
        f"records {figures['records']} in {figures['shards']} shards; "
        f"node layout: {figures['node_layout']}; scope "
        f"{figures['scope']}, {figures['packing']} packing, packs per rank {plan.n_packs} of "
        + (
            f"at most {config.plan.max_tokens} tokens (contract tokens)"
            if config.plan.contract == "tokens"
            else f"{figures['pack_size']} records"
        )
        + (
            f"; planned for {config.canonical_ranks} canonical ranks "
            f"({config.canonical_node_ranks} per node), {config.hosted} per rank"
            if config.canonical_ranks
            else ""
        )
    )
    print(
        f"balance efficiency per micro-batch {figures['efficiency_per_micro_batch']:.4f}, per "
        f"optimizer step ({figures['micro_batches_per_step']} micro-batches per rank) "
        f"{figures['efficiency_per_step']:.4f}; cv_ranks per micro-batch "
        f"{figures['cv_ranks']:.4f}"
    )
    left = ", ".join(f"{k} {v}" for k, v in sorted(remainder["by_reason"].items()))
    print(f"records not in a pack: {remainder['count']}" + (f" ({left})" if left else ""))
    for s in streams or []:
        print(
            f"stream {s['path']}: {s['records_drawn']} records this epoch of "
            f"{s['records']}, used {s['records_used']}, left {s['records_left'] or 'none'}"
        )
    return 0
