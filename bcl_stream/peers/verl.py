"""verl's batch balancing, reproduced exactly: the ``verl_kk`` and ``verl_dynbsz`` peers.

Follows verl-project/verl at revision 1dda039b9c6311889a9c9a26040677e1254814f9 (the workload
balance arrived in 62221fa, Oct 2025): ``calculate_workload``, ``karmarkar_karp``,
``get_seqlen_balanced_partitions`` and ``rearrange_micro_batches`` in
``verl/utils/seqlen_balancing.py``; ``RayPPOTrainer._balance_batch`` in
``verl/trainer/ppo/ray_trainer.py`` (defaults: no prefix grouper, ``keep_minibatch=False``);
the micro-batching of ``prepare_micro_batches`` in ``verl/workers/engine/utils.py``.
Re-implemented from reading that code; heap and sort tie-breaking are verl's.

``verl_kk`` (``balance_batch=True``, fixed micro-batch size): the driver splits each global
batch of R*B*G records into R parts of exactly B*G records with Karmarkar-Karp (largest
differencing, ``equal_size=True``) on verl's workload estimate 24576*L + L^2 (a 7B model,
hidden size 4096), sorts each part by (workload, position) and lays it out in "pipe" order
(small items at both ends: ascending at even positions, then the odd ones descending). Rank r
takes part r and cuts it into G micro-batches of B consecutive records. The record-count
contract holds; it needs a central driver holding the global batch.

``verl_dynbsz`` (``use_dynamic_bsz=True``): the same driver balance, then each rank splits its
part into ``min(records, ceil(tokens / max_token_len))`` micro-batches, raised to the largest
count of any rank (an all-reduce), by Karmarkar-Karp without the equal-size constraint on the
workload, ordered by workload descending and then laid out with the small ones at both ends.
Records per micro-batch vary: it breaks the record-count contract.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from bcl_stream.peers.pools import Bins, Pool, Remainder

VERL_REVISION = "1dda039b9c6311889a9c9a26040677e1254814f9"


def verl_workload(tokens: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """verl's ``calculate_workload``: 24576*L + L^2 (int64, as verl upcasts)."""
    tok = np.asarray(tokens, dtype=np.int64)
    return 24576 * tok + tok * tok


class _Set:
    """One part under construction; ordered by (sum, item count, items) as verl orders it."""

    __slots__ = ("items", "sum")

    def __init__(self) -> None:
        self.sum: float = 0
        self.items: list[tuple[int, float]] = []

    def key(self) -> tuple[float, int, list[tuple[int, float]]]:
        return self.sum, len(self.items), self.items


class _State:
    """k parts, largest first. Heap order: largest spread first, then the largest top part."""

    __slots__ = ("sets",)

    def __init__(self, items: list[tuple[int, float]], k: int) -> None:
        self.sets = [_Set() for _ in range(k)]
        for part, (idx, value) in zip(self.sets, items, strict=False):
            part.items.append((idx, value))
            part.sum += value
        self.sets.sort(key=_Set.key, reverse=True)

    def spread(self) -> float:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: _State) -> bool:
        mine, theirs = self.spread(), other.spread()
        if mine != theirs:
            return mine > theirs
        return other.sets[0].key() < self.sets[0].key()

    def merge(self, other: _State) -> None:
        """Largest part of one with the smallest of the other, and so on."""
        for part, add in zip(self.sets, reversed(other.sets), strict=True):
            for idx, value in add.items:
                part.items.append((idx, value))
                part.sum += value
        self.sets.sort(key=_Set.key, reverse=True)


def karmarkar_karp(values: Sequence[float], k: int, equal_size: bool) -> list[list[int]]:
    """verl's ``karmarkar_karp``: k parts of positions, in verl's part and item order.

    With ``equal_size`` each part gets ``len(values) / k`` items (the values are taken k at a
    time in ascending order, one per part, before differencing)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ranked = sorted((value, i) for i, value in enumerate(values))
    heap: list[_State] = []
    if equal_size:
        if len(ranked) % k:
            raise ValueError(f"equal_size needs len(values) % k == 0, got {len(ranked)} % {k}")
        for start in range(0, len(ranked), k):
            chunk = [(i, value) for value, i in ranked[start : start + k]]
            heapq.heappush(heap, _State(chunk, k))
    else:
        for value, i in ranked:
            heapq.heappush(heap, _State([(i, value)], k))
    while len(heap) > 1:
        first = heapq.heappop(heap)
        first.merge(heapq.heappop(heap))
        heapq.heappush(heap, first)
    if not heap:
        raise ValueError("karmarkar_karp needs at least one value")
    return [[idx for idx, _ in part.items] for part in heap[0].sets]


def balanced_partitions(values: Sequence[float], k: int, equal_size: bool) -> list[list[int]]:
    """verl's ``get_seqlen_balanced_partitions``: KK parts, each sorted by position; every
    part non-empty."""
    if len(values) < k:
        raise ValueError(f"cannot make {k} non-empty parts of {len(values)} items")
    parts = [sorted(p) for p in karmarkar_karp(values, k, equal_size)]
    if any(not p for p in parts):
        raise ValueError(f"Karmarkar-Karp left a part empty ({len(values)} items, k={k})")
    return parts


def pipe_order(part: Sequence[int], workload: Sequence[float]) -> list[int]:
    """``_balance_batch``'s order inside a rank: sort by (workload, position), take the even
    positions ascending, then the odd ones descending (small items at both ends)."""
    ranked = sorted(part, key=lambda x: (workload[x], x))
    return ranked[::2] + ranked[1::2][::-1]


def balance_batch(workload: Sequence[float], world_size: int) -> list[list[int]]:
    """``RayPPOTrainer._balance_batch``: positions of the global batch for each rank, in the
    order that rank runs them."""
    parts = balanced_partitions(workload, world_size, equal_size=True)
    return [pipe_order(p, workload) for p in parts]


def dynamic_micro_batches(
    tokens: Sequence[int], workload: Sequence[float], n_micro: int
) -> list[list[int]]:
    """``rearrange_micro_batches`` with ``use_dynamic_bsz_balance=True`` once the micro-batch
    count is known: KK without equal sizes, heaviest first, then small ones at both ends."""
    if not 1 <= n_micro <= len(tokens):
        raise ValueError(f"need 1 <= micro-batches <= records, got {n_micro} for {len(tokens)}")
    parts = balanced_partitions(workload, n_micro, equal_size=False)
    parts.sort(key=lambda p: (sum(workload[i] for i in p), p[0]), reverse=True)
    return parts[::2][::-1] + parts[1::2]


def verl_kk(pool: Pool) -> tuple[Bins, Remainder]:
    """verl's balanced global batches with a fixed micro-batch of B records.

    Output: ``[rank][micro-batch]`` arrays of exactly B record ids (G per global batch), and
    ``{"epoch_tail": ids}`` for the last partial global batch."""

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        workload = verl_workload(pool.tokens[members]).tolist()
        for r, positions in enumerate(balance_batch(workload, pool.world_size)):
            share = members[np.asarray(positions, dtype=np.int64)]
            for micro in share.reshape(pool.grad_accum, pool.pack_size):
                yield r, micro

    return pool.deal(plan_batch)


def verl_dynbsz(pool: Pool, max_token_len: int) -> tuple[Bins, Remainder]:
    """verl's dynamic batch size after the same driver balance (``ppo_max_token_len_per_gpu``
    = ``max_token_len``, no sequence parallelism, no virtual pipeline).

    Output: ``[rank][micro-batch]`` arrays of record ids; every rank has the same number of
    micro-batches per global batch, record counts vary."""
    tok = pool.tokens

    def plan_batch(members: npt.NDArray[np.int64]) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        too_long = np.flatnonzero(tok[members] > max_token_len)
        if too_long.size:
            sid = int(members[too_long[0]])
            raise ValueError(
                f"record {sid}: {int(tok[sid])} tokens exceed max_token_len {max_token_len}; "
                "verl refuses it: raise max_token_len or drop longer records"
            )
        shares = [
            members[np.asarray(p, dtype=np.int64)]
            for p in balance_batch(verl_workload(tok[members]).tolist(), pool.world_size)
        ]
        # Each rank's own count, then the all-reduce MAX (same_micro_num_in_dp=True).
        n_micro = max(min(s.size, -(-int(tok[s].sum()) // max_token_len)) for s in shares)
        for r, share in enumerate(shares):
            local = tok[share]
            for part in dynamic_micro_batches(
                local.tolist(), verl_workload(local).tolist(), n_micro
            ):
                yield r, share[np.asarray(part, dtype=np.int64)]

    return pool.deal(plan_batch)
