"""The checks a reader config with canonical ranks must pass (``ReaderConfig.__post_init__``):
each refusal names the value seen and the ones that work (docs/elastic.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bcl_stream.planner.config import MAX_RANKS
from bcl_stream.planner.contracts import contract

if TYPE_CHECKING:
    from bcl_stream.epoch.plan import ReaderConfig


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (the physical sizes a canonical plan runs on)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_canonical(config: ReaderConfig) -> None:
    """``canonical_ranks`` checks: R divides V, the canonical node size divides V, and the
    settings a canonical plan cannot keep are refused, each naming what works."""
    v, per_node = config.canonical_ranks, config.canonical_ranks_per_node
    if v is None:
        if per_node is not None:
            raise ValueError("canonical_ranks_per_node needs canonical_ranks")
        return
    for name, value in (("canonical_ranks", v), ("canonical_ranks_per_node", per_node)):
        if value is not None and (type(value) is not int or not 1 <= value <= MAX_RANKS):
            raise ValueError(f"{name} must be an integer in [1, {MAX_RANKS}], got {value!r}")
    r = config.plan.world_size
    if v % r:
        raise ValueError(
            f"canonical_ranks={v} cannot run on {r} data-parallel ranks: the physical size must "
            f"divide it, one of {divisors(v)}"
        )
    if per_node is None:  # not pinned: a resume adopts the cursor's (epoch/cursor.py)
        per_node = config.plan.ranks_per_node
    if v % per_node:
        raise ValueError(
            f"canonical_ranks_per_node={per_node} does not divide canonical_ranks={v}; give "
            f"canonical_ranks_per_node as one of {divisors(v)}"
        )
    if not contract(config.plan.contract).canonical:
        raise ValueError(
            f"canonical_ranks needs contract='pack' or 'tokens', got {config.plan.contract!r}: "
            "the step contract re-cuts each step among the ranks of a node, which depends on "
            "the physical layout"
        )
