"""The torch process group, when one is initialised: where readers and reader configs take
the world size and the rank from when they are not given.

Read without importing torch: a process group exists only after ``torch.distributed`` was
imported (``init_process_group``), so a process that never imported it has none, and the
planner side of the package stays free of torch.
"""

from __future__ import annotations

import os
import sys

from bcl_stream.process_layout import ProcessLayout


def process_group() -> ProcessLayout | None:
    """The initialised default process group (``torch.distributed.is_available() and
    is_initialized()``) as a layout of one process a rank, or None without one: its size,
    this process's rank, and the launcher's ranks per node where it states a usable one
    (else 1; :func:`launcher_ranks_per_node` refuses an unusable one where it matters)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    return ProcessLayout(
        rank=int(dist.get_rank()),
        world_size=world,
        ranks_per_node=_launcher_local(world) or 1,
    )


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
    local = _launcher_local(world_size)
    if local is None:
        raise ValueError(
            f"{LOCAL_WORLD_SIZE}={text!r} does not divide the process group's world size "
            f"{world_size}: give ranks_per_node=... explicitly"
        )
    return local


def _launcher_local(world_size: int) -> int | None:
    """``LOCAL_WORLD_SIZE`` where it is an integer >= 1 that divides ``world_size``, else None."""
    try:
        local = int(os.environ.get(LOCAL_WORLD_SIZE, ""))
    except ValueError:
        return None
    return local if local >= 1 and world_size % local == 0 else None
