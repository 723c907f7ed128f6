"""How the processes of a job sit: one type for the data-parallel rank, the data-parallel size
and the ranks per node, wherever they travel together.

Why one type: before it the same three facts went around in six shapes (``(world_size,
ranks_per_node)`` pairs, the command line's layout, the process group's, the trainer's, two
texts of the same layout), and each shape checked, defaulted and printed them its own way.
A :class:`ProcessLayout` is checked once when built and says itself in the words every summary
uses. It is composed into what needs more (the Lightning side's ``TrainerLayout`` adds the
trainer's accumulation), never subclassed.

**Ranks are data-parallel ranks.** Under tensor or context parallelism the ``group_size``
processes of one model-parallel group run the same micro-batch and yield identical packs: the
plan is made for ``world_size`` data-parallel ranks, and Mosaic Streaming is told the physical
``local_processes`` (``lightning_module/trainer_layout.py`` says why).

No torch: every layer from ``epoch`` up may import it (it checks its numbers with the
planner's ``checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bcl_stream.planner import checks
from bcl_stream.planner.config import MAX_RANKS


class HasRanks(Protocol):
    """What carries a job's shape without a rank: a planner config (``PlanConfig``)."""

    @property
    def world_size(self) -> int: ...

    @property
    def ranks_per_node(self) -> int: ...


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessLayout:
    """This process's data-parallel rank among ``world_size`` data-parallel ranks,
    ``ranks_per_node`` on each node. A ValueError names a value that does not fit."""

    rank: int = 0
    """Data-parallel rank: the plan's rank whose packs this process yields (0 where a layout
    describes the whole job, as the ``plan`` command's does)."""
    world_size: int
    """Data-parallel size R: the ranks the plan is made for."""
    ranks_per_node: int = 1
    """Data-parallel ranks per node P; divides ``world_size``. A node reads only its own shards."""
    group_size: int = 1
    """Processes per data-parallel rank (tensor x context parallel): they yield identical packs."""
    processes_per_node: int | None = None
    """Processes per physical node, what Mosaic Streaming shares its memory across; None: one
    process per data-parallel rank (``ranks_per_node``)."""

    def __post_init__(self) -> None:
        for name in ("world_size", "ranks_per_node", "group_size"):
            checks.integer(getattr(self, name), name, 1, MAX_RANKS)
        if self.processes_per_node is not None:
            checks.integer(self.processes_per_node, "processes_per_node", 1, MAX_RANKS)
        checks.integer(self.rank, "rank", 0, MAX_RANKS)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} does not divide world_size={self.world_size}"
            )

    @classmethod
    def of_plan(cls, plan: HasRanks, rank: int = 0) -> ProcessLayout:
        """The layout a planner config was made for (its world size and ranks per node)."""
        return cls(rank=rank, world_size=plan.world_size, ranks_per_node=plan.ranks_per_node)

    @property
    def nodes(self) -> int:
        """Nodes of the job, R / P."""
        return self.world_size // self.ranks_per_node

    @property
    def node(self) -> int:
        """The node this rank sits on (whose shards it reads)."""
        return self.rank // self.ranks_per_node

    @property
    def local_processes(self) -> int:
        """Processes per physical node (what Mosaic Streaming is told: ``LOCAL_WORLD_SIZE``)."""
        if self.processes_per_node is None:
            return self.ranks_per_node
        return self.processes_per_node

    def text(self) -> str:
        """``2 nodes x 4 ranks (world 8)``: the words the commands' summaries use."""
        return (
            f"{_plural(self.nodes, 'node')} x {_plural(self.ranks_per_node, 'rank')} "
            f"(world {self.world_size})"
        )

    def ranks_text(self) -> str:
        """``8 ranks = 2 nodes x 4 ranks per node``: how many nodes a plan assumed, as a
        message about the plan says it (ranks per node decides which shards a rank may read,
        so a message that leaves it out can describe another set-up than the one planned)."""
        return (
            f"{_plural(self.world_size, 'rank')} = {_plural(self.nodes, 'node')} x "
            f"{_plural(self.ranks_per_node, 'rank')} per node"
        )

    def to_json(self) -> dict[str, Any]:
        """The job's shape as ``--json`` summaries carry it (``node_layout`` is :meth:`text`;
        the rank, where a summary has one, is its own key)."""
        return {
            "world_size": self.world_size,
            "ranks_per_node": self.ranks_per_node,
            "nodes": self.nodes,
            "node_layout": self.text(),
        }
