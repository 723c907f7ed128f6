"""``bcl-stream plan``: every rank's packs of one epoch, computed from the cost index alone.

This is exactly the plan the readers follow (``bcl_stream.plan.epoch.full_plan``), so it
can be diffed against ``bcl-stream read`` and inspected without touching any shard.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.commands.config_options import add_plan_config_options, plan_fields
from bcl_stream.plan.checks import check_format_scope, require_packs
from bcl_stream.plan.epoch import PACKINGS, EpochPlan, PlanData, ReaderConfig


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``read``: the dataset and everything that decides a plan
    (every PlanConfig field, generated: ``commands/config_options.py``)."""
    p.add_argument(
        "location",
        metavar="DIR",
        nargs="?",
        default=None,
        help="dataset root: a directory or s3://bucket/path (or give --stream, repeated)",
    )
    add_stream_options(p)
    add_plan_config_options(p)
    p.add_argument(
        "--packing",
        choices=PACKINGS,
        default="bcl",
        help="bcl (balanced packs) or sequential (the plain-loader baseline, same epoch order)",
    )
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


def open_plan_data(args: argparse.Namespace) -> tuple[PlanData, str]:
    """The cost index (one dataset) or the mixture the options name, and a label for messages.
    Remote streams cache under ``<cache-dir>/stream-<i>``."""
    from bcl_stream.io.remote import open_cost_index

    if (args.location is None) == (args.stream is None):
        raise ValueError("give a dataset DIR or --stream (repeated) for a mixture, not both")
    if args.stream is None:
        if args.epoch_size is not None:
            raise ValueError("--epoch-size applies to a mixture (--stream) only")
        index, _ = open_cost_index(args.location, cache_dir(args))
        return index, args.location
    from bcl_stream.plan.streams import MixtureIndex, StreamSpec

    specs = [StreamSpec.parse(text) for text in args.stream]
    root = stream_cache_root(args, specs)
    indexes = []
    for i, spec in enumerate(specs):
        index, _ = open_cost_index(spec.path, None if root is None else f"{root}/stream-{i}")
        indexes.append(index)
    mixture = MixtureIndex(specs, indexes, epoch_size=args.epoch_size)
    return mixture, ",".join(spec.path for spec in specs)


def stream_cache_root(args: argparse.Namespace, specs: list[Any]) -> str | None:
    """The cache root for a mixture's remote streams (a temporary one if none was given)."""
    from bcl_stream.io.remote import is_remote

    if args.cache_dir is None and any(is_remote(s.path) for s in specs):
        import tempfile

        args.cache_dir = tempfile.mkdtemp(prefix="bcl_cache_")
    return str(args.cache_dir) if args.cache_dir is not None else None


def check_formats(index: PlanData, location: str, scope: str) -> None:
    """Refuse a scope some stream's reader cannot serve (WebDataset: rank only)."""
    from bcl_stream.plan.streams import MixtureIndex

    if isinstance(index, MixtureIndex):
        for spec, ix in zip(index.specs, index.indexes, strict=True):
            check_format_scope(spec.path, ix.format, scope)
    else:
        check_format_scope(location, index.format, scope)


def config_from_args(args: argparse.Namespace) -> ReaderConfig:
    return ReaderConfig.build(
        seed=args.seed, cost_model=args.cost_model, packing=args.packing, **plan_fields(args)
    )


def cache_dir(args: argparse.Namespace) -> str | None:
    """The remote cache directory (a temporary one if none was given)."""
    from bcl_stream.io.remote import is_remote

    if args.cache_dir is None and args.location is not None and is_remote(args.location):
        import tempfile

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
    """Packs as JSON lists: sample ids, or for a mixture [stream, sample id] pairs (what
    ``read`` prints too, so the two can be diffed)."""
    from bcl_stream.plan.streams import MixtureIndex

    if not isinstance(index, MixtureIndex):
        return packs.tolist()
    stream, local = index.locate(packs)
    return [
        [[s, i] for s, i in zip(srow, irow, strict=True)]
        for srow, irow in zip(stream.tolist(), local.tolist(), strict=True)
    ]


def run(args: argparse.Namespace) -> int:
    from bcl_stream.plan.epoch import full_plan, stream_report

    config = config_from_args(args)
    index, location = open_plan_data(args)
    check_formats(index, location, config.plan.scope)
    plan = full_plan(index, config, args.epoch)
    require_packs(location, plan, config, len(index))
    streams = stream_report(index, config, plan)
    if args.json:
        ranks = [
            {"rank": r, "packs": pack_json(index, plan.rank_packs(r))}
            for r in range(config.plan.world_size)
        ]
        out: dict[str, Any] = {"ranks": ranks, "remainder": remainder_json(plan)}
        if streams is not None:
            out["streams"] = streams
        print(json.dumps(out))
        return 0
    costs = index.costs()
    pack_costs = costs[plan.plan.packs].sum(axis=2) if plan.n_packs else costs[:0]
    records = len(index) if streams is None else sum(s["records_drawn"] for s in streams)
    print(f"records {records}, ranks {config.plan.world_size}, packs per rank {plan.n_packs}")
    if plan.n_packs:
        steps = pack_costs.max(axis=0)
        print(f"balance efficiency {pack_costs.mean(axis=0).sum() / steps.sum():.4f}")
    print(f"remainder {remainder_json(plan)}")
    for s in streams or []:
        print(
            f"stream {s['path']}: {s['records_drawn']} records this epoch of "
            f"{s['records']}, used {s['records_used']}, left {s['records_left'] or 'none'}"
        )
    return 0
