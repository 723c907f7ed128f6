"""The torch process group, when one is initialised: where readers and reader configs take
the world size and the rank from when they are not given.

Read without importing torch: a process group exists only after ``torch.distributed`` was
imported (``init_process_group``), so a process that never imported it has none, and the
planner side of the package stays free of torch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """The default process group: its number of processes and this process's rank in it."""

    world_size: int
    rank: int


def process_group() -> GroupLayout | None:
    """The initialised default process group (``torch.distributed.is_available() and
    is_initialized()``), or None without one."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return GroupLayout(int(dist.get_world_size()), int(dist.get_rank()))


LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
"""What torchrun (and Lightning's launchers) set to the number of processes on this node."""


def launcher_ranks_per_node(world_size: int) -> int | None:
    """Ranks per node as the launcher says it (``LOCAL_WORLD_SIZE``), or None where it says
    nothing. Why: a world size taken from the group with ranks per node left at 1 would plan
    an 8-GPU node as 8 nodes of one rank (packs unlike what a node's reads assume), the habit
    trap of a torchrun user who gave neither. One that does not divide the world size is
    refused naming both (a launcher's value, so the user must give ``ranks_per_node``)."""
    text = os.environ.get(LOCAL_WORLD_SIZE)
    if text is None:
        return None
    try:
        local = int(text)
    except ValueError:
        local = 0
    if local < 1 or world_size % local:
        raise ValueError(
            f"{LOCAL_WORLD_SIZE}={text!r} does not divide the process group's world size "
            f"{world_size}: give ranks_per_node=... explicitly"
        )
    return local
