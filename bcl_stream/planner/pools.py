"""Global batches for the pooled peers (``nemo_mffd``, ``verl_kk``, ``verl_dynbsz``).

A central driver (NeMo-RL's policy, verl's single controller) holds one global batch of
R*B*G records, plans it for every rank, and ships each rank its share. In the simulator the
global batches are consecutive slices of the stream order a peer is given; a last partial
global batch is left out as ``epoch_tail``, as a trainer with ``drop_last`` would.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.bcl import REASON_TAIL

Bins = list[list[npt.NDArray[np.int64]]]
"""[rank][micro-batch] -> record ids of the records that rank runs in that micro-batch."""
Remainder = dict[str, npt.NDArray[np.int64]]


def global_batches(
    order: npt.NDArray[np.integer], world_size: int, pack_size: int, grad_accum: int
) -> tuple[npt.NDArray[np.int64], Remainder]:
    """(n_batches, R*B*G) record ids of each full global batch, and the tail by reason."""
    if min(world_size, pack_size, grad_accum) < 1:
        raise ValueError(
            "world_size, pack_size and grad_accum must be >= 1, got "
            f"{world_size}, {pack_size}, {grad_accum}"
        )
    ids = np.asarray(order, dtype=np.int64).ravel()
    size = world_size * pack_size * grad_accum
    n = ids.size // size
    return ids[: n * size].reshape(n, size), {REASON_TAIL: ids[n * size :]}


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
