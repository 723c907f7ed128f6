"""The strategies BCL is measured against (docs/metrics.md, Baselines).

``sequential``: each rank takes the next B records of its own share of the same node streams
BCL reads (a plain loader over the same shards and shuffle): ``plan_epoch(..., balanced=False)``
plans it with ``PlanConfig.unbalanced``, BCL's configuration with balancing switched off, so
the two differ only in the packing. With a memory cap, longer records are left out and
reported as BCL does, but the per-pack token cap is not enforced: a plain loader cannot.
``pooled_mffd_split``: pool a global batch of R*B*G records, pack by tokens with a textbook
MFFD (``mffd.py``) into bins of capacity M, deal the bins round-robin so every rank runs the
same number of bins. When the bin count is not a multiple of R, the fullest bins are split in
two until it is. No system ships this: NeMo-RL's own packer is ``nemo.py`` (``nemo_mffd``),
which differs in four steps and balances worse. It stays as a stronger central token packer
than any peer ships, to show how much a better packer would change the comparison.
Record counts per bin vary (it breaks the record-count contract) and it needs a central pool.

Central baselines read from :func:`global_order`: one shuffle of every record, what a trainer's
``DataLoader(shuffle=True)`` over a map-style dataset does (every node then reads every shard).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.mffd import mffd
from bcl_stream.planner.pools import Bins, Pool, Remainder
from bcl_stream.planner.rng import Tag, epoch_rng


def global_order(
    n_records: int, seed: int, epoch: int, *, shuffle: bool = True
) -> npt.NDArray[np.int64]:
    """Every record once, globally shuffled by (seed, epoch), or write order: a central sampler."""
    if not shuffle:
        return np.arange(n_records, dtype=np.int64)
    return epoch_rng(seed, epoch, Tag.GLOBAL_ORDER).permutation(n_records).astype(np.int64)


def _split_to_multiple(bins: list[list[int]], sizes: npt.NDArray[np.int64], multiple: int) -> None:
    while len(bins) % multiple:
        loads = [int(sizes[b].sum()) if len(b) > 1 else -1 for b in bins]
        fullest = int(np.argmax(loads))
        if loads[fullest] < 0:  # only single-record bins: nothing left to split
            break
        items = sorted(bins[fullest], key=lambda i: -int(sizes[i]))
        bins[fullest], extra = items[0::2], items[1::2]
        bins.append(extra)


def pooled_mffd_split(pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """Bins per rank (each a variable-length array of record ids) and the remainder by reason.

    Global batches of R*B*G records are packed one at a time, in stream order; a last partial
    global batch is left out (``epoch_tail``) as a trainer would.
    """

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        sizes = pool.tokens[members]
        bins = mffd(sizes, capacity)
        _split_to_multiple(bins, sizes, pool.world_size)
        for b, positions in enumerate(bins):
            yield b % pool.world_size, members[np.asarray(positions, dtype=np.int64)]

    return pool.deal(plan_batch)
