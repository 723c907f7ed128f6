"""The epoch's stream order: a pure function of (shard sizes, seed, epoch).

Shards are shuffled as whole units, then records are shuffled inside consecutive blocks of
``block`` records. A rank (or node) that takes a contiguous chunk of this order touches only
about ``chunk / shard_size + 2`` shards, which is what keeps scope ``rank`` reading only its
own share; the block shuffle mixes records of neighbouring shards so that one long-record
shard does not become one expensive window. Every rank computes the same order without
communication because the cost index lists every shard's record count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

DEFAULT_BLOCK = 1 << 14


def epoch_rng(seed: int, epoch: int, stream: int = 0) -> np.random.Generator:
    """The generator for one (seed, epoch); ``stream`` separates independent uses."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return np.random.default_rng([seed, epoch, stream])


def epoch_order(
    shard_counts: Sequence[int] | npt.NDArray[np.integer],
    seed: int,
    epoch: int,
    *,
    block: int = DEFAULT_BLOCK,
    shuffle: bool = True,
) -> npt.NDArray[np.int64]:
    """A permutation of ``range(sum(shard_counts))``: global sample ids in stream order.

    Sample ids are global indices in the dataset's write order (shard 0's records first).
    With ``shuffle=False`` the order is the write order.
    """
    counts = np.asarray(shard_counts, dtype=np.int64)
    if counts.ndim != 1 or np.any(counts < 0):
        raise ValueError(
            f"shard_counts must be a 1-D list of non-negative counts, got {shard_counts!r}"
        )
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    total = int(counts.sum())
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    rng = epoch_rng(seed, epoch)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    shard_perm = rng.permutation(counts.size)
    order = np.concatenate(
        [np.arange(starts[s], starts[s] + counts[s], dtype=np.int64) for s in shard_perm]
        or [np.empty(0, dtype=np.int64)]
    )
    # Shuffle inside consecutive blocks: sort by (block index, random key).
    keys = rng.random(total)
    block_of = np.arange(total, dtype=np.int64) // block
    return order[np.lexsort((keys, block_of))]
