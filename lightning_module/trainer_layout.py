"""What the trainer decides and the plan follows (data-parallel rank and size, data-parallel
ranks per node, accumulation), read from Lightning's Trainer or Fabric, or from the process
group, never set by hand.

**Ranks are data-parallel ranks.** Under tensor or context parallelism the processes of one
model-parallel group (``group_size`` of them: TP x CP) run the same micro-batch together, so
they must be given identical packs, and the plan is made for the data-parallel size, not the
world size: with 4 processes as 2 data-parallel x 2 tensor-parallel the plan is the one for 2
ranks, and processes 0 and 1 both yield data-parallel rank 0's packs. Where the data-parallel
rank comes from, first found wins:

1. the strategy's device mesh, its ``data_parallel`` dimension (Lightning's
   ``ModelParallelStrategy``, a mesh handed to :meth:`TrainerLayout.of_process_group`);
2. the strategy's ``distributed_sampler_kwargs`` (``num_replicas``, ``rank``): what Lightning
   gives a ``DistributedSampler`` (DDP, FSDP, DeepSpeed: the world size and the global rank);
3. a ``ModelParallelStrategy`` whose processes are not launched yet (a Trainer built but not
   fitted, as a config test builds it): the sizes it was given, ``"auto"`` resolved as
   Lightning resolves it (data-parallel = nodes, tensor-parallel = devices per node);
4. the world size and the global rank.

**Data-parallel ranks per node** follow from the devices per node ``n`` and the group size
``g``: ``n // g`` when a group fits in a node (TP=4 on 8 devices: 2), 1 when a group spans
nodes (TP=16 on 8 devices: a "node" of the plan is then the g/n physical nodes of one group).
This needs the processes of a group to have consecutive global ranks (data-parallel the outer
dimension of the mesh), as Lightning's mesh has; another layout is refused, naming the ranks.

**Mosaic Streaming keeps the physical layout.** Its shared memory (shard states, the cache
lock, the locals registry) is per physical node and its local leader is the first process of
the node, so it is given the *processes* per node (``processes_per_node``), not the
data-parallel ranks per node: the tensor-parallel peers of a node then share one cache and
download a shard once (its shard states live in that shared memory, under its cache lock: read
in streaming 0.13's ``StreamingDataset.prepare_shard``, not measured here), and read the same
records because they follow the same plan (measured: the mesh tests). Given the
data-parallel count instead (1 with TP=8), several processes of one machine would each see
itself as a node's leader and register the same shared memory (tried: 2 x 2 told 2 processes
per node, ``FileExistsError: '/0000NN_locals'`` on rank 0). Streaming's own
``replication`` (its iteration order repeated over consecutive ranks) does not apply: the
readers follow the plan, not streaming's partition.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from bcl_stream import ProcessLayout

DATA_PARALLEL_DIM = "data_parallel"
"""The device mesh dimension holding data-parallel ranks (Lightning's ``ModelParallelStrategy``
names it so; a custom mesh for ``of_process_group`` must use it too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerLayout:
    """What the trainer decides and the plan follows: read from it in ``setup()``, never a
    user knob that could disagree with it. The process layout (data-parallel rank and size,
    ranks per node, model-parallel group) is core's :class:`ProcessLayout`, composed here with
    what only a trainer knows, its accumulation (see the module docstring for the ranks)."""

    process: ProcessLayout
    """Data-parallel rank, data-parallel size, data-parallel ranks per node
    (``Trainer.num_devices`` without model parallelism), group size, processes per node."""
    grad_accum: int | None = None
    """Micro-batches per optimizer step (``Trainer.accumulate_grad_batches``): the plan deals
    each step's packs so that per-step sums balance too. None: no trainer decides it (Fabric,
    scripts): ``plan={"grad_accum": G}`` or 1."""

    def __post_init__(self) -> None:
        if not isinstance(self.process, ProcessLayout):
            raise ValueError(f"process must be a ProcessLayout, got {self.process!r}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")

    @classmethod
    def of_trainer(cls, trainer: Any) -> TrainerLayout:
        """A Lightning ``Trainer``'s layout: data-parallel ranks from its strategy."""
        return cls.of_processes(
            global_rank=trainer.global_rank,
            processes=trainer.world_size,
            processes_per_node=max(1, trainer.num_devices),
            data_parallel=data_parallel_of(trainer.strategy),
            grad_accum=int(trainer.accumulate_grad_batches),
        )

    @classmethod
    def of_fabric(cls, fabric: Any, grad_accum: int | None = None) -> TrainerLayout:
        """A Lightning ``Fabric``'s layout; Fabric does not know the script's accumulation."""
        nodes = max(1, int(getattr(fabric.strategy, "num_nodes", 1)))
        return cls.of_processes(
            global_rank=fabric.global_rank,
            processes=fabric.world_size,
            processes_per_node=max(1, fabric.world_size // nodes),
            data_parallel=data_parallel_of(fabric.strategy),
            grad_accum=grad_accum,
        )

    @classmethod
    def of_process_group(cls, mesh: Any = None) -> TrainerLayout:
        """No trainer: the process group's layout (one node unless ``LOCAL_WORLD_SIZE`` says
        otherwise), data-parallel ranks from ``mesh`` (a ``DeviceMesh`` with a
        ``data_parallel`` dimension) if given; or a single process."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            return cls.of_processes(
                global_rank=torch.distributed.get_rank(),
                processes=world,
                processes_per_node=local,
                data_parallel=None if mesh is None else mesh_data_parallel(mesh),
            )
        return cls(process=ProcessLayout(world_size=1))

    @classmethod
    def of_processes(
        cls,
        *,
        global_rank: int,
        processes: int,
        processes_per_node: int,
        data_parallel: tuple[int, int] | None,
        grad_accum: int | None = None,
    ) -> TrainerLayout:
        """The layout of process ``global_rank`` of ``processes`` (``processes_per_node`` on
        each node) whose data-parallel (rank, size) is ``data_parallel`` (None: every process
        is its own data-parallel rank). See the module docstring for the rules."""
        dp_rank, dp_size = (global_rank, processes) if data_parallel is None else data_parallel
        if dp_size < 1 or processes % dp_size:
            raise ValueError(
                f"the data-parallel size {dp_size} does not divide the {processes} processes: "
                "check the strategy's data_parallel_size"
            )
        group = processes // dp_size
        if dp_rank != global_rank // group:
            raise ValueError(
                f"process {global_rank} has data-parallel rank {dp_rank}, but with groups of "
                f"{group} consecutive processes it would be {global_rank // group}: bcl-stream "
                "needs the data-parallel dimension outermost in the device mesh (as Lightning's "
                "ModelParallelStrategy builds it)"
            )
        per_node = processes_per_node // group if processes_per_node % group == 0 else 1
        process = ProcessLayout(
            rank=dp_rank,
            world_size=dp_size,
            ranks_per_node=per_node,
            group_size=group,
            processes_per_node=processes_per_node,
        )
        return cls(process=process, grad_accum=grad_accum)


def data_parallel_dim(mesh: Any) -> Any | None:
    """A device mesh's ``data_parallel`` sub-mesh (its ranks, size and process group); None
    if the mesh has no such dimension (or there is no mesh)."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh[DATA_PARALLEL_DIM] if DATA_PARALLEL_DIM in names else None


def strategy_mesh(strategy: Any) -> Any | None:
    """A Lightning strategy's device mesh; None where it has none or before launch."""
    try:
        return getattr(strategy, "device_mesh", None)
    except RuntimeError:  # ModelParallelStrategy before its processes are launched
        return None


def mesh_data_parallel(mesh: Any) -> tuple[int, int] | None:
    """(rank, size) along a device mesh's ``data_parallel`` dimension; None if it has none."""
    dp = data_parallel_dim(mesh)
    return None if dp is None else (int(dp.get_local_rank()), int(dp.size()))


def data_parallel_of(strategy: Any) -> tuple[int, int] | None:
    """A Lightning strategy's data-parallel (rank, size), by the rules of the module
    docstring; None: every process is its own data-parallel rank."""
    found = mesh_data_parallel(strategy_mesh(strategy))
    if found is not None:
        return found
    try:
        kwargs = getattr(strategy, "distributed_sampler_kwargs", None)
    except (RuntimeError, AssertionError):
        kwargs = None
    if isinstance(kwargs, dict) and {"num_replicas", "rank"} <= set(kwargs):
        return int(kwargs["rank"]), int(kwargs["num_replicas"])
    return _configured_mesh(strategy)


def _configured_mesh(strategy: Any) -> tuple[int, int] | None:
    """A ``ModelParallelStrategy`` not launched yet: its data-parallel (rank, size) from the
    sizes it was given. Relies on the attributes ``_data_parallel_size`` and
    ``_tensor_parallel_size`` (Lightning 2.6.6, pinned) and resolves ``"auto"`` as its
    ``setup_environment`` does: data-parallel = nodes, tensor-parallel = devices per node."""
    dp = getattr(strategy, "_data_parallel_size", None)
    tp = getattr(strategy, "_tensor_parallel_size", None)
    if dp is None or tp is None:
        return None
    nodes = max(1, int(getattr(strategy, "num_nodes", 1)))
    devices = len(getattr(strategy, "parallel_devices", None) or []) or 1
    dp = nodes if dp == "auto" else int(dp)
    tp = devices if tp == "auto" else int(tp)
    rank = int(getattr(strategy, "global_rank", 0))
    return rank // tp, dp
