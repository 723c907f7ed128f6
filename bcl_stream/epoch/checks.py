"""Checks on an epoch plan that every entry point makes the same way (``plan``, ``read``,
``simulate --dataset``, ``BCLDataModule``), so a configuration no reader can serve is refused
before anything prints or trains, in one line that names the values and the fix.

Numpy only (the CLI's ``plan`` imports this; it must start fast).
"""

from __future__ import annotations

from bcl_stream.epoch.plan import EpochPlan, ReaderConfig, ReaderPlan
from bcl_stream.errors import PlanError


def require_packs(
    location: str,
    plan: ReaderPlan | EpochPlan,
    config: ReaderConfig,
    records: int,
    fix: str = "Lower --pack-size or --world-size, or use more data.",
) -> None:
    """Refuse a plan without a single pack: training on it stops at once and reports success
    (Lightning: "No training batches", exit 0)."""
    if plan.n_packs:
        return
    raise no_pack_error(
        location,
        plan.epoch,
        records,
        plan.remainder_counts(),
        config.plan.world_size,
        config.plan.pack_size,
        fix,
    )


def no_pack_error(
    location: str,
    epoch: int,
    records: int,
    left: dict[str, int],
    world_size: int,
    pack_size: int,
    fix: str,
    what: str = "no pack for any rank",
) -> PlanError:
    """The one message for an epoch without a pack (``plan``, ``read``, ``simulate``, the
    DataModule): the records, what was left out, what one pack per rank needs, the fix."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(left.items())) or "none"
    need = world_size * pack_size
    return PlanError(
        f"{location}: {what} in epoch {epoch}: {records} records (left out: {reasons}) cannot "
        f"give each of {world_size} ranks one pack of {pack_size} records (needs at least "
        f"{need} per epoch). {fix}"
    )
