"""What the trainer decides and the plan follows (world size, ranks per node, accumulation),
read from Lightning's Trainer or Fabric, or from the process group, never set by hand."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerLayout:
    """What the trainer decides and the plan follows: read from it in ``setup()``, never a
    user knob that could disagree with it."""

    rank: int
    world_size: int
    ranks_per_node: int
    """Devices per node (``Trainer.num_devices``)."""
    grad_accum: int | None = None
    """Micro-batches per optimizer step (``Trainer.accumulate_grad_batches``): the plan deals
    each step's packs so that per-step sums balance too. None: no trainer decides it (Fabric,
    scripts): ``plan={"grad_accum": G}`` or 1."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.ranks_per_node < 1 or self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} must divide world_size={self.world_size}"
            )
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")

    @classmethod
    def of_trainer(cls, trainer: Any) -> TrainerLayout:
        """A Lightning ``Trainer``'s layout."""
        return cls(
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            ranks_per_node=max(1, trainer.num_devices),
            grad_accum=int(trainer.accumulate_grad_batches),
        )

    @classmethod
    def of_fabric(cls, fabric: Any, grad_accum: int | None = None) -> TrainerLayout:
        """A Lightning ``Fabric``'s layout; Fabric does not know the script's accumulation."""
        nodes = max(1, int(getattr(fabric.strategy, "num_nodes", 1)))
        return cls(
            rank=fabric.global_rank,
            world_size=fabric.world_size,
            ranks_per_node=max(1, fabric.world_size // nodes),
            grad_accum=grad_accum,
        )

    @classmethod
    def of_process_group(cls) -> TrainerLayout:
        """No trainer: the process group's layout (one node), or a single process."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            return cls(rank=torch.distributed.get_rank(), world_size=world, ranks_per_node=local)
        return cls(rank=0, world_size=1, ranks_per_node=1)
