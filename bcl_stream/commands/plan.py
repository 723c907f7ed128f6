"""``bcl-stream plan``: every rank's packs of one epoch, computed from the cost index alone.

This is exactly the plan the readers follow (``bcl_stream.plan_source.epoch_plan``), so it
can be diffed against ``bcl-stream read`` and inspected without touching any shard.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.plan_checks import check_format_scope, require_packs
from bcl_stream.plan_source import EpochPlan, ReaderConfig
from bcl_stream.planner import SCOPES
from bcl_stream.planner.order import DEFAULT_SHARD_GROUP


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``read``: the dataset and everything that decides a plan."""
    p.add_argument("location", metavar="DIR", help="dataset root: a directory or s3://bucket/path")
    p.add_argument("--world-size", type=int, required=True, help="data-parallel ranks R")
    p.add_argument(
        "--ranks-per-node", type=int, default=1, help="ranks per node (scope node balances them)"
    )
    p.add_argument("--pack-size", type=int, required=True, help="records per pack B")
    p.add_argument("--window", type=int, required=True, help="packs per rank per window W")
    p.add_argument(
        "--scope",
        choices=SCOPES,
        default="rank",
        help="ranks balanced jointly (WebDataset: rank only)",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--epoch", type=int, default=0, help="epoch to plan (its order depends on it)")
    p.add_argument("--max-tokens", type=int, default=None, help="memory cap M per pack")
    p.add_argument(
        "--carry", type=int, default=0, help="planner carry-over records per rank (0: none)"
    )
    p.add_argument(
        "--shard-group",
        type=int,
        default=DEFAULT_SHARD_GROUP,
        help="shards a node shuffles together (shuffle quality vs shard cache)",
    )
    p.add_argument("--no-shuffle", action="store_true", help="keep the write order")
    p.add_argument("--cost-model", default=None, help="recompute costs: preset or JSON file")
    p.add_argument("--cache-dir", default=None, help="local cache for remote datasets")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def config_from_args(args: argparse.Namespace) -> ReaderConfig:
    return ReaderConfig(
        world_size=args.world_size,
        ranks_per_node=args.ranks_per_node,
        pack_size=args.pack_size,
        window=args.window,
        scope=args.scope,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        shard_group=args.shard_group,
        max_tokens=args.max_tokens,
        carry=args.carry,
        cost_model=args.cost_model,
    )


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
    check_format_scope(args.location, index.format, config.scope)
    plan = epoch_plan(index, config, args.epoch)
    require_packs(args.location, plan, config, len(index))
    if args.json:
        ranks = [
            {"rank": r, "packs": plan.rank_packs(r).tolist()} for r in range(config.world_size)
        ]
        print(json.dumps({"ranks": ranks, "remainder": remainder_json(plan)}))
        return 0
    costs = index.costs()
    pack_costs = costs[plan.plan.packs].sum(axis=2) if plan.n_packs else costs[:0]
    print(f"records {len(index)}, ranks {config.world_size}, packs per rank {plan.n_packs}")
    if plan.n_packs:
        steps = pack_costs.max(axis=0)
        print(f"balance efficiency {pack_costs.mean(axis=0).sum() / steps.sum():.4f}")
    print(f"remainder {remainder_json(plan)}")
    return 0
