"""The torch process group, when one is initialised: where readers and reader configs take
the world size and the rank from when they are not given.

Read without importing torch: a process group exists only after ``torch.distributed`` was
imported (``init_process_group``), so a process that never imported it has none, and the
planner side of the package stays free of torch.
"""

from __future__ import annotations

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
