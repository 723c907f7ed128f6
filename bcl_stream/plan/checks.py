"""Checks on an epoch plan that every entry point makes the same way (``plan``, ``read``,
``simulate --dataset``, ``BCLDataModule``), so a configuration no reader can serve is refused
before anything prints or trains, in one line that names the values and the fix.

Numpy only (the CLI's ``plan`` imports this; it must start fast).
"""

from __future__ import annotations

from bcl_stream.errors import PlanError
from bcl_stream.plan.epoch import AnyPlan, ReaderConfig


def check_format_scope(location: str, fmt: str, scope: str, option: str = "--scope") -> None:
    """Refuse what the reader of ``fmt`` refuses: the WebDataset reader reads shards
    sequentially, one contiguous share per rank, so it has scope ``rank`` only."""
    if fmt == "wds" and scope != "rank":
        raise PlanError(
            f"{location} is a WebDataset dataset: its reader supports {option} rank only (got "
            f"{scope!r}), because it reads shards sequentially; use {option} rank, or write "
            "the dataset as MDS (preprocess --format mds) for scopes node and world"
        )


def require_packs(
    location: str,
    plan: AnyPlan,
    config: ReaderConfig,
    records: int,
    fix: str = "Lower --pack-size or --world-size, or use more data.",
) -> None:
    """Refuse a plan without a single pack: training on it stops at once and reports success
    (Lightning: "No training batches", exit 0)."""
    if plan.n_packs:
        return
    counts = plan.remainder_counts()
    left = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())) or "none"
    need = config.plan.world_size * config.plan.pack_size
    raise PlanError(
        f"{location}: no pack for any rank in epoch {plan.epoch}: {records} records (left out: "
        f"{left}) cannot give each of {config.plan.world_size} ranks one pack of {config.plan.pack_size} "
        f"records (needs at least {need} per epoch). {fix}"
    )
