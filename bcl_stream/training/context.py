"""``TrainingContext``: what the trainer decides and the readers follow, in one object.

Why one object: the data-parallel layout, the accumulation and the model's sequence limit
each change the plan (who reads which records, how a step's packs are dealt, what a long
record costs). A Lightning trainer, Fabric, a plain torchrun loop and Hugging Face Accelerate
each know them; composed here they reach :func:`~bcl_stream.training.resolve.resolve` together,
never as knobs a user could set against the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

from bcl_stream.epoch.process_group import launcher_ranks_per_node, process_group
from bcl_stream.process_layout import ProcessLayout


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingContext:
    """The trainer's side of a training run: the data-parallel layout, the micro-batches per
    optimizer step and the model's sequence limit."""

    process: ProcessLayout
    """Data-parallel rank, size and ranks per node."""
    grad_accum: int | None = None
    """Micro-batches per optimizer step as the trainer runs them; None: the trainer does not
    say (then 1, or G_c x V/R under canonical ranks)."""
    max_seq_len: int | None = None
    """The model's sequence limit (``max_position_embeddings``): records are fed at most this
    many tokens, and planned at that cost. None: the model states none."""

    def __post_init__(self) -> None:
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1 or None, got {self.max_seq_len}")

    @classmethod
    def of_process_group(
        cls, *, grad_accum: int | None = None, max_seq_len: int | None = None
    ) -> TrainingContext:
        """A plain loop's context: one data-parallel rank per process of the initialised
        process group (ranks per node from the launcher's ``LOCAL_WORLD_SIZE``, else one
        node), or a single process without one."""
        group = process_group()
        if group is None:
            layout = ProcessLayout(rank=0, world_size=1, ranks_per_node=1)
        else:
            per_node = launcher_ranks_per_node(group.world_size) or group.world_size
            layout = ProcessLayout(
                rank=group.rank, world_size=group.world_size, ranks_per_node=per_node
            )
        return cls(process=layout, grad_accum=grad_accum, max_seq_len=max_seq_len)
