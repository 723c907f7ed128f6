"""The checks a reader config with canonical ranks must pass (``ReaderConfig.__post_init__``):
each refusal names the value seen and the ones that work (docs/elastic.md)."""

from __future__ import annotations

from bcl_stream.planner.config import MAX_RANKS, PlanConfig
from bcl_stream.planner.contracts import contract


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (the physical sizes a canonical plan runs on)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_canonical(plan: PlanConfig, v: int | None, per_node: int | None) -> None:
    """``canonical_ranks`` (``v``) and ``canonical_ranks_per_node`` checks against the
    physical planner config ``plan``: R divides V, the canonical node size divides V, and the
    settings a canonical plan cannot keep are refused, each naming what works. Takes the
    values, not the reader config, so that this module needs nothing of ``epoch/plan.py``
    (which calls it), not even its type."""
    if v is None:
        if per_node is not None:
            raise ValueError("canonical_ranks_per_node needs canonical_ranks")
        return
    for name, value in (("canonical_ranks", v), ("canonical_ranks_per_node", per_node)):
        if value is not None and (type(value) is not int or not 1 <= value <= MAX_RANKS):
            raise ValueError(f"{name} must be an integer in [1, {MAX_RANKS}], got {value!r}")
    r = plan.world_size
    if v % r:
        raise ValueError(
            f"canonical_ranks={v} cannot run on {r} data-parallel ranks: the physical size must "
            f"divide it, one of {divisors(v)}"
        )
    if per_node is None:  # not pinned: a resume adopts the cursor's (epoch/cursor.py)
        per_node = plan.ranks_per_node
    if v % per_node:
        raise ValueError(
            f"canonical_ranks_per_node={per_node} does not divide canonical_ranks={v}; give "
            f"canonical_ranks_per_node as one of {divisors(v)}"
        )
    if not contract(plan.contract).canonical:
        raise ValueError(
            f"canonical_ranks needs contract='pack' or 'tokens', got {plan.contract!r}: "
            "the step contract re-cuts each step among the ranks of a node, which depends on "
            "the physical layout"
        )
