"""The strategies BCL is measured against (DESIGN.md, Metrics).

``sequential``: each rank takes the next B records of its own stream, what a plain loader does.
``pooled_mffd_split``: pool a global batch of R*B*G records, pack by tokens with a textbook
MFFD (``mffd.py``) into bins of capacity M, deal the bins round-robin so every rank runs the
same number of bins. When the bin count is not a multiple of R, the fullest bins are split in
two until it is. No system ships this: NeMo-RL's own packer is ``nemo.py`` (``nemo_mffd``),
which differs in four steps and balances worse. It stays as a stronger central token packer
than any peer ships, to show how much a better packer would change the comparison.
Record counts per bin vary (it breaks the record-count contract) and it needs a central pool.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.bcl import REASON_TAIL, Plan, _split_groups
from bcl_stream.planner.mffd import mffd


def sequential(order: npt.NDArray[np.integer], world_size: int, pack_size: int) -> Plan:
    """Rank r's t-th pack = records t*B..t*B+B-1 of its contiguous share of the stream."""
    if world_size < 1 or pack_size < 1:
        raise ValueError(f"world_size and pack_size must be >= 1, got {world_size}, {pack_size}")
    ids = np.asarray(order, dtype=np.int64)
    n_packs = (ids.size // world_size) // pack_size
    streams, tail = _split_groups(ids, world_size, n_packs * pack_size)
    return Plan(streams.reshape(world_size, n_packs, pack_size), {REASON_TAIL: tail})


def _split_to_multiple(bins: list[list[int]], sizes: npt.NDArray[np.int64], multiple: int) -> None:
    while len(bins) % multiple:
        loads = [int(sizes[b].sum()) if len(b) > 1 else -1 for b in bins]
        fullest = int(np.argmax(loads))
        if loads[fullest] < 0:  # only single-record bins: nothing left to split
            break
        items = sorted(bins[fullest], key=lambda i: -int(sizes[i]))
        bins[fullest], extra = items[0::2], items[1::2]
        bins.append(extra)


def pooled_mffd_split(
    order: npt.NDArray[np.integer],
    tokens: npt.NDArray[np.integer],
    world_size: int,
    pack_size: int,
    grad_accum: int,
    capacity: int,
) -> tuple[list[list[npt.NDArray[np.int64]]], dict[str, npt.NDArray[np.int64]]]:
    """Bins per rank (each a variable-length array of sample ids) and the remainder by reason.

    Global batches of R*B*G records are packed one at a time, in stream order; a last partial
    global batch is left out (``epoch_tail``) as a trainer would.
    """
    if min(world_size, pack_size, grad_accum) < 1:
        raise ValueError(
            f"world_size, pack_size, grad_accum must be >= 1, got {world_size}, {pack_size}, {grad_accum}"
        )
    ids = np.asarray(order, dtype=np.int64)
    tok = np.asarray(tokens, dtype=np.int64)
    pool = world_size * pack_size * grad_accum
    n_pools = ids.size // pool
    per_rank: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(world_size)]
    for p in range(n_pools):
        members = ids[p * pool : (p + 1) * pool]
        sizes = tok[members]
        bins = mffd(sizes, capacity)
        _split_to_multiple(bins, sizes, world_size)
        for b, positions in enumerate(bins):
            per_rank[b % world_size].append(members[np.asarray(positions, dtype=np.int64)])
    return per_rank, {REASON_TAIL: ids[n_pools * pool :]}
