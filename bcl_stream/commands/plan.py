"""``bcl-stream plan``: every rank's packs of one epoch, computed from the cost index alone.

This is exactly the plan the readers follow (``bcl_stream.plan_source.epoch_plan``), so it
can be diffed against ``bcl-stream read`` and inspected without touching any shard.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.commands.config_options import add_plan_config_options, plan_fields
from bcl_stream.plan_checks import check_format_scope, require_packs
from bcl_stream.plan_source import EpochPlan, ReaderConfig


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``read``: the dataset and everything that decides a plan
    (every PlanConfig field, generated: ``commands/config_options.py``)."""
    p.add_argument("location", metavar="DIR", help="dataset root: a directory or s3://bucket/path")
    add_plan_config_options(p)
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--epoch", type=int, default=0, help="epoch to plan (its order depends on it)")
    p.add_argument("--cost-model", default=None, help="recompute costs: preset or JSON file")
    p.add_argument("--cache-dir", default=None, help="local cache for remote datasets")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def config_from_args(args: argparse.Namespace) -> ReaderConfig:
    return ReaderConfig.build(seed=args.seed, cost_model=args.cost_model, **plan_fields(args))


def cache_dir(args: argparse.Namespace) -> str | None:
    """The remote cache directory (a temporary one if none was given)."""
    from bcl_stream.remote import is_remote

    if args.cache_dir is None and is_remote(args.location):
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


def run(args: argparse.Namespace) -> int:
    from bcl_stream.plan_source import epoch_plan
    from bcl_stream.remote import open_cost_index

    config = config_from_args(args)
    index, _ = open_cost_index(args.location, cache_dir(args))
    check_format_scope(args.location, index.format, config.plan.scope)
    plan = epoch_plan(index, config, args.epoch)
    require_packs(args.location, plan, config, len(index))
    if args.json:
        ranks = [
            {"rank": r, "packs": plan.rank_packs(r).tolist()} for r in range(config.plan.world_size)
        ]
        print(json.dumps({"ranks": ranks, "remainder": remainder_json(plan)}))
        return 0
    costs = index.costs()
    pack_costs = costs[plan.plan.packs].sum(axis=2) if plan.n_packs else costs[:0]
    print(f"records {len(index)}, ranks {config.plan.world_size}, packs per rank {plan.n_packs}")
    if plan.n_packs:
        steps = pack_costs.max(axis=0)
        print(f"balance efficiency {pack_costs.mean(axis=0).sum() / steps.sum():.4f}")
    print(f"remainder {remainder_json(plan)}")
    return 0
