"""``ProcessLayout``: the data-parallel rank, size and ranks per node, in one type.

Why one type: the plan is made for data-parallel ranks, and every entry point (a Lightning
trainer, Fabric, a plain torchrun loop, Hugging Face Accelerate) knows the same three numbers.
Carried together they cannot drift apart on the way to the planner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessLayout:
    """Where this process sits among the data-parallel ranks the plan is made for."""

    rank: int
    """Data-parallel rank: the plan's rank whose packs this process yields."""
    world_size: int
    """Data-parallel size: the ranks the plan is made for."""
    ranks_per_node: int
    """Data-parallel ranks per node (a node's ranks read its shards together)."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.ranks_per_node < 1 or self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} must divide world_size={self.world_size}"
            )
