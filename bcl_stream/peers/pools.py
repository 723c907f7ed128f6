"""What every pooled peer reads: the epoch order of a central sampler, cut into global batches.

A central driver (NeMo-RL's policy, verl's single controller) holds one global batch of R*B*G
records, plans it for every rank, and ships each rank its share; in a Transformers Trainer
every rank plans the same global batch alike, from a shared seed. In the simulator the global
batches are consecutive slices of the order a peer is given (:func:`global_order`: one shuffle
of every record, what a trainer's ``DataLoader(shuffle=True)`` over a map-style dataset does,
so every node reads every shard); a last partial global batch is left out as ``epoch_tail``,
as a trainer with ``drop_last`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.config import REASON_TAIL
from bcl_stream.planner.rng import Tag, epoch_rng

Bins = list[list[npt.NDArray[np.int64]]]
"""[rank][micro-batch] -> record ids of the records that rank runs in that micro-batch."""
Remainder = dict[str, npt.NDArray[np.int64]]
Ids = npt.NDArray[np.int64]


def global_order(n_records: int, seed: int, epoch: int, *, shuffle: bool = True) -> Ids:
    """Every record once, globally shuffled by (seed, epoch), or write order: a central sampler."""
    if not shuffle:
        return np.arange(n_records, dtype=np.int64)
    return epoch_rng(seed, epoch, Tag.GLOBAL_ORDER).permutation(n_records).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Pool:
    """One epoch as a central driver pools it: every pooled peer's input. ``order``: the
    record ids in the order the driver reads them; ``tokens``: token counts by record id; a
    global batch holds R*B*G records (``world_size`` x ``pack_size`` x ``grad_accum``)."""

    order: Ids
    tokens: Ids
    world_size: int
    pack_size: int
    grad_accum: int

    def __post_init__(self) -> None:
        if min(self.world_size, self.pack_size, self.grad_accum) < 1:
            raise ValueError(
                "world_size, pack_size and grad_accum must be >= 1, got "
                f"{self.world_size}, {self.pack_size}, {self.grad_accum}"
            )
        object.__setattr__(self, "order", np.asarray(self.order, dtype=np.int64).ravel())
        object.__setattr__(self, "tokens", np.asarray(self.tokens, dtype=np.int64))

    @property
    def batch_size(self) -> int:
        """Records per global batch, R*B*G."""
        return self.world_size * self.pack_size * self.grad_accum

    def batches(self) -> tuple[Ids, Remainder]:
        """(n_batches, R*B*G) record ids of each full global batch, and the tail by reason."""
        n = self.order.size // self.batch_size
        full = self.order[: n * self.batch_size].reshape(n, self.batch_size)
        return full, {REASON_TAIL: self.order[n * self.batch_size :]}

    def deal(
        self, plan_batch: Callable[[Ids], Iterable[tuple[int, Ids]]]
    ) -> tuple[Bins, Remainder]:
        """Every full global batch planned by ``plan_batch`` (its record ids -> (rank, one
        micro-batch's record ids) in each rank's order), the last partial batch left out."""
        batches, remainder = self.batches()
        per_rank: Bins = [[] for _ in range(self.world_size)]
        for members in batches:
            for rank, ids in plan_batch(members):
                per_rank[rank].append(ids)
        return per_rank, remainder


def micro_batches_per_batch(
    rank_bins: list[npt.NDArray[np.int64]], order: npt.NDArray[np.integer], batch_size: int
) -> npt.NDArray[np.int64]:
    """How many of one rank's micro-batches come from each full global batch of ``order``
    (the same for every rank): the optimizer steps of a pooled peer, for step-level sync."""
    ids = np.asarray(order, dtype=np.int64).ravel()
    n_batches = ids.size // batch_size
    if not rank_bins:
        return np.zeros(n_batches, dtype=np.int64)
    position = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    position[ids] = np.arange(ids.size)
    first = np.array([int(mb[0]) for mb in rank_bins], dtype=np.int64)
    return np.bincount(position[first] // batch_size, minlength=n_batches).astype(np.int64)
