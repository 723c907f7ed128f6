"""The plan of a validation or test pass: every record exactly once across ranks, and the same
number of packs on every rank.

Why not the training plan: training keeps exactly B records per pack and leaves the epoch's
tail out (reported); a validation loss over a set that drops a different tail per world size
is not comparable between runs. Here a pack holds at most B records: each rank's share is cut
into the same number of packs P = max over ranks of ceil(share / B), as evenly as possible
(sizes differ by at most one), so collectives in ``validation_step`` (``sync_dist``) never hang
and no record is dropped or repeated. No epochs, no shuffle, no resume state: a pass is a pure
function of the data, the world size and B.

Two packings:

- ``sequential``: rank r reads a contiguous share of the write order (what a plain sharded
  loader does; shards stay local to a rank);
- ``bcl``: records sorted by cost and dealt to ranks in snake order, each rank's share cut in
  cost order, so pack t of every rank holds records of similar cost: steps balance across
  ranks, and padded batches hold similar lengths (little padding). Records are then read out
  of write order (random access; a WebDataset rank scans its shards in the order packs need
  them).

Refused (:class:`~bcl_stream.errors.PlanError`): fewer records than ranks, and pack size 1
with a record count that ranks cannot share evenly (a rank would need an empty pack).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import PlanError

EVAL_PACKINGS = ("sequential", "bcl")


class EvalPlan:
    """Every rank's packs of one evaluation pass (see the module docstring). Duck-compatible
    with the training plans where readers use them: ``epoch``, ``n_packs``,
    ``iter_rank_packs``, ``rank_packs``, ``remainder_counts``."""

    epoch = 0

    def __init__(
        self,
        costs: npt.ArrayLike,
        world_size: int,
        pack_size: int,
        packing: str = "sequential",
        location: str = "evaluation data",
    ) -> None:
        if packing not in EVAL_PACKINGS:
            raise ValueError(f"evaluation packing must be one of {EVAL_PACKINGS}, got {packing!r}")
        values = np.asarray(costs, dtype=np.float64)
        n = int(values.size)
        if n < world_size:
            raise PlanError(
                f"{location}: {n} records cannot give each of {world_size} ranks one record to "
                "evaluate; use more data or fewer ranks"
            )
        if packing == "sequential":
            shares = np.array_split(np.arange(n, dtype=np.int64), world_size)
        else:
            # Costliest first, dealt in snake order (0..R-1, R-1..0, ...): every rank gets
            # the same mix of costs, and its t-th pack is about every other rank's t-th.
            by_cost = np.argsort(-values, kind="stable").astype(np.int64)
            position = np.arange(n)
            within, block = position % world_size, position // world_size
            owner = np.where(block % 2 == 0, within, world_size - 1 - within)
            shares = [by_cost[owner == r] for r in range(world_size)]
        self.n_packs = max(-(-len(s) // pack_size) for s in shares)
        if min(len(s) for s in shares) < self.n_packs:
            raise PlanError(
                f"{location}: {n} records on {world_size} ranks in packs of {pack_size} leave a "
                f"rank {min(len(s) for s in shares)} records for {self.n_packs} packs (every rank "
                "runs the same number of steps, and a pack cannot be empty); use pack_size >= 2 "
                "or a record count divisible by the number of ranks"
            )
        self.world_size, self.pack_size, self.packing = world_size, pack_size, packing
        self.records = n
        self._packs = [np.array_split(share, self.n_packs) for share in shares]

    def rank_packs(self, rank: int) -> list[npt.NDArray[np.int64]]:
        """Rank ``rank``'s packs (record ids; at most B each, sizes differ by at most one)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return self._packs[rank]

    def iter_rank_packs(
        self, rank: int, start: int = 0, group: bool = False
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(index of the first pack, packs (n, width)) from pack ``start`` on, in runs of packs
        of one size (what the readers' ``_read_packs`` takes)."""
        if group:
            raise ValueError("an evaluation plan is walked rank by rank (no steps)")
        packs = self.rank_packs(rank)
        t = start
        while t < len(packs):
            end = t
            while end < len(packs) and len(packs[end]) == len(packs[t]):
                end += 1
            yield t, np.stack(packs[t:end])
            t = end

    def remainder_counts(self) -> dict[str, int]:
        """Records left out: none, every record is evaluated once."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "world_size": self.world_size,
            "packs_per_rank": self.n_packs,
            "pack_size": self.pack_size,
            "packing": self.packing,
        }
