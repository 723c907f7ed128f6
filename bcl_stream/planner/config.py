"""The planner's configuration and its output type (one place for every planning knob)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.order import DEFAULT_SHARD_GROUP
from bcl_stream.planner.partition import ALGORITHMS

SCOPES = ("rank", "node", "world")
PACK_ORDERS = ("desc", "stream")
REASON_TOO_LONG = "longer_than_max_tokens"
REASON_TAIL = "epoch_tail"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """Everything besides data and (seed, epoch) that decides a plan."""

    world_size: int
    """Number of data-parallel ranks R."""
    pack_size: int
    """Records per pack B: the trainer's record-count contract."""
    window: int
    """Packs per rank planned together W: a rank buffers W*B records (times P for wider scopes)."""
    ranks_per_node: int = 1
    """Ranks per node P; must divide ``world_size``. A node reads only its own shards."""
    scope: str = "rank"
    """``rank`` | ``node`` | ``world``: which ranks are balanced jointly."""
    max_tokens: int | None = None
    """Memory cap M: max tokens per pack. Records longer than M go to the remainder."""
    algorithm: str = "lpt"
    """Partition algorithm (``bcl_stream.planner.partition.ALGORITHMS``); ``stream`` keeps
    stream order (the ``sequential`` baseline)."""
    refine: int = 8
    """Swap-refinement iterations after the partition (0 disables)."""
    pack_order: str = "desc"
    """Order of the packs inside a window: ``desc`` or ``stream``."""
    step_fill: bool = True
    """Give the step-mates of an unbalanceable heavy pack more work (``planner/step_fill.py``);
    scope ``world`` agrees on the heavy steps across nodes. Needs ``pack_order="desc"``."""
    carry: int | None = None
    """Records per rank read beyond the window and possibly held back one window to steer the
    window's total cost to the epoch mean (``planner/carry.py``). None: W*B/4; 0 disables.
    Buffer per rank = W*B + carry records."""
    carry_span: int = 64
    """Windows per carry chain: the carry drains and restarts every ``carry_span`` windows, so
    a reader resuming at any window replays at most ``carry_span - 1`` hold-backs and the
    cursor holds no carry (0: one chain per epoch)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step G. Above 1 (scopes node/world) the packs of each step
    are handed to ranks so that every rank's per-step sum is balanced too (DDP ``no_sync``)."""
    shuffle: bool = True
    """False streams in write order (nodes still take disjoint spans of shards)."""
    stratify: bool = True
    """Shuffle each group so that every W*B records hold one record of every cost stratum
    (``order.stratified_permutation``): windows of every rank and node then carry the same mix
    of cheap and expensive records. False: a plain shuffle (what a plain loader does)."""
    split_shards: float = 0.05
    """Extra download amplification allowed for cutting the heaviest shards into pieces read by
    every node (``order.split_heavy_shards``); 0 keeps every shard on one node. Measured on
    length-sorted heavy-tailed corpora (tools/bench_balance.py, 4 nodes x 8): 0.05 lifts the
    world efficiency by 3-6 points there and changes other corpora by < 0.3 points."""
    shard_group: int = DEFAULT_SHARD_GROUP
    """Shards whose records a node shuffles together (``planner/order.py``): shuffle quality
    against the shard cache (a node holds at most 2 groups)."""

    def __post_init__(self) -> None:
        for name in ("world_size", "pack_size", "window", "ranks_per_node", "grad_accum"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} does not divide world_size={self.world_size}"
            )
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"algorithm must be one of {sorted(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if self.refine < 0:
            raise ValueError(f"refine must be >= 0, got {self.refine}")
        if self.pack_order not in PACK_ORDERS:
            raise ValueError(f"pack_order must be one of {PACK_ORDERS}, got {self.pack_order!r}")
        if self.carry is not None and not 0 <= self.carry < self.window * self.pack_size:
            raise ValueError(
                f"carry must be in [0, window*pack_size={self.window * self.pack_size}), got {self.carry!r}"
            )
        if not isinstance(self.carry_span, int | np.integer) or self.carry_span < 0:
            raise ValueError(f"carry_span must be an integer >= 0, got {self.carry_span!r}")
        if not 0.0 <= self.split_shards <= 1.0:
            raise ValueError(f"split_shards must be in [0, 1], got {self.split_shards!r}")
        if not isinstance(self.shard_group, int | np.integer) or self.shard_group < 1:
            raise ValueError(f"shard_group must be an integer >= 1, got {self.shard_group!r}")

    @property
    def carry_records(self) -> int:
        """Records per rank of lookahead actually used (resolves the None default)."""
        return self.window * self.pack_size // 4 if self.carry is None else self.carry

    @property
    def n_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def group_size(self) -> int:
        """Ranks partitioned jointly (one planning row): 1 for ``rank``, P otherwise. Scope
        ``world`` couples the node rows through shared step targets, not shared records."""
        return 1 if self.scope == "rank" else self.ranks_per_node


@dataclass(frozen=True, slots=True)
class Plan:
    """One epoch's packs for every rank, plus what was left out and why."""

    packs: npt.NDArray[np.int64]
    """(world_size, n_packs, pack_size) global sample ids."""
    remainder: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    """Sample ids not emitted this epoch, keyed by reason."""

    @property
    def n_packs(self) -> int:
        """Packs per rank (identical on every rank)."""
        return int(self.packs.shape[1])

    @property
    def records_used(self) -> int:
        return int(self.packs.size)

    @property
    def records_left(self) -> int:
        return int(sum(ids.size for ids in self.remainder.values()))

    def remainder_counts(self) -> dict[str, int]:
        """Reason -> count, for reports."""
        return {reason: int(ids.size) for reason, ids in self.remainder.items() if ids.size}
