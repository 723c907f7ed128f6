"""The shard table and the record filter: what every process knows of the data up front.

The shard table is O(shards), read from the replicated index: records per shard, how many are
usable this epoch, their mean cost, and for cut shards, mixtures and repeats which entry is
what. :class:`KeepFilter` says which records are eligible this epoch (memory cap, records
consumed before an elastic resize, a mixture's draw); :func:`shard_sums` is the one chunked
pass over the records that per-shard figures need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bcl_stream.planner import checks

PASS_RECORDS = 1 << 20
"""Records per chunk of passes over the whole cost array (8 MB of float64 temporaries)."""

Ids = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ShardTable:
    """Per-shard facts every process reads from the replicated index (O(shards), not O(records)).

    ``counts``: records per shard in write order. ``usable``: records of each shard eligible
    this epoch (fewer when a memory cap or an elastic resume removes some). ``weight``: mean
    record cost of each shard, the key the shards are stratified by (zeros: no stratification).
    """

    counts: Ids
    usable: Ids
    weight: npt.NDArray[np.float64]
    split: Ids | None = None
    """For a table whose heaviest shards were cut (``cuts.cut_shards``): for each entry,
    the index of the cut shard it is a piece of (pieces of one shard are consecutive, one per
    node), or -1 for a whole shard."""
    stream: Ids | None = None
    """For a mixture (``planner.mixture``): the stream (source dataset) of each entry. Streams
    are dealt to nodes and groups separately, so every node and every group holds each
    stream's share; None for one dataset."""
    origin: Ids | None = None
    """For a mixture whose stream repeats: the entry each copy of a shard follows to its node
    (the shard's first copy), -1 for none; so a shard read twice in an epoch is downloaded by
    one node."""

    @classmethod
    def build(
        cls,
        counts: npt.ArrayLike,
        usable: npt.ArrayLike | None = None,
        weight: npt.ArrayLike | None = None,
        split: npt.ArrayLike | None = None,
        stream: npt.ArrayLike | None = None,
        origin: npt.ArrayLike | None = None,
    ) -> ShardTable:
        """A validated table; ``usable`` defaults to ``counts``, ``weight`` to zeros.

        Every argument is checked (1-D, numeric, whole where counts are meant, equal lengths,
        values in range) and refused with a ValueError naming it."""
        c = checks.array(counts, "shard counts", whole=True)
        if np.any(c < 0):
            raise ValueError(f"shard counts must be >= 0, got min {int(c.min())}")
        u = c.copy() if usable is None else checks.array(usable, "usable counts", whole=True)
        w = np.zeros(c.size) if weight is None else checks.array(weight, "weight", whole=False)
        if u.shape != c.shape or w.shape != c.shape:
            raise ValueError(f"usable {u.shape} and weight {w.shape} must match counts {c.shape}")
        if np.any(u < 0) or np.any(u > c):
            raise ValueError("usable counts must lie in [0, counts] for every shard")
        if not np.all(np.isfinite(w)):
            raise ValueError("shard weights must be finite")
        pieces = None if split is None else checks.array(split, "split", whole=True)
        if pieces is not None and pieces.shape != c.shape:
            raise ValueError(f"split {pieces.shape} must match counts {c.shape}")
        if pieces is not None and np.any((pieces < -1) | (pieces >= c.size)):
            raise ValueError(f"split must hold -1 or a shard index in [0, {c.size}) per entry")
        labels = None if stream is None else checks.array(stream, "stream", whole=True)
        if labels is not None and (labels.shape != c.shape or np.any(labels < 0)):
            raise ValueError(f"stream {labels.shape} must match counts {c.shape}, values >= 0")
        follows = None if origin is None else checks.array(origin, "origin", whole=True)
        if follows is not None and (
            follows.shape != c.shape or np.any((follows < -1) | (follows >= c.size))
        ):
            raise ValueError(f"origin must hold -1 or an entry in [0, {c.size}) per entry")
        return cls(c, u, w, pieces, labels, follows)

    def with_usable(self, usable: npt.ArrayLike, weight: npt.ArrayLike | None = None) -> ShardTable:
        """The same shards with other usable counts (and mean costs): a filter's view."""
        return ShardTable.build(
            self.counts,
            usable,
            self.weight if weight is None else weight,
            self.split,
            self.stream,
            self.origin,
        )

    def stream_groups(self, entries: Ids) -> list[Ids]:
        """``entries`` split by stream (one array for one dataset), each in the given order."""
        if self.stream is None:
            return [entries]
        labels = self.stream[entries]
        return [entries[labels == s] for s in np.unique(labels)]

    @property
    def starts(self) -> Ids:
        """Global id of each shard's first record."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def mean_cost(self) -> float:
        """Mean cost of a usable record of the epoch, from the table alone (the same in every
        process): the windows' cost target and the heavy lane's scale."""
        usable = int(self.usable.sum())
        return float((self.weight * self.usable).sum()) / usable if usable else 0.0

    @property
    def n_records(self) -> int:
        return int(self.counts.sum())


def shard_sums(
    counts: npt.ArrayLike, columns: Callable[[int, int], npt.NDArray[np.float64]], rows: int = 1
) -> npt.NDArray[np.float64]:
    """Per-shard sums (rows, shards) of ``columns(lo, hi)``, a (rows, hi - lo) array of per-record
    values for records [lo, hi), in chunks of ``PASS_RECORDS`` records: a pass over every record with
    no full-size temporary beside a mapped array."""
    c = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(c)
    starts = ends - c
    n = int(ends[-1]) if ends.size else 0
    sums = np.zeros((rows, c.size))
    for lo in range(0, n, PASS_RECORDS):
        hi = min(lo + PASS_RECORDS, n)
        values = np.reshape(columns(lo, hi), (rows, hi - lo))
        first_shard = int(np.searchsorted(ends, lo, side="right"))
        last_shard = int(np.searchsorted(ends, hi - 1, side="right"))
        shards = np.arange(first_shard, last_shard + 1)
        shards = shards[c[shards] > 0]  # empty shards own no records (reduceat would misread)
        local = np.maximum(starts[shards] - lo, 0)
        sums[:, shards] += np.add.reduceat(values, local, axis=1)
    return sums


def shard_weights(
    counts: npt.ArrayLike, costs: npt.NDArray[np.floating]
) -> npt.NDArray[np.float64]:
    """Mean cost per record of each shard: one chunked pass over the cost array (once per
    dataset and cost model), refusing NaN, infinite and negative costs with the first bad index."""
    c = np.asarray(counts, dtype=np.int64)
    n = int(c.sum())
    if costs.shape[0] != n:
        raise ValueError(f"costs hold {costs.shape[0]} records, the shard counts {n}")

    def checked(lo: int, hi: int) -> npt.NDArray[np.float64]:
        chunk = np.asarray(costs[lo:hi], dtype=np.float64)
        bad = ~np.isfinite(chunk) | (chunk < 0)
        if bad.any():
            first = lo + int(np.flatnonzero(bad)[0])
            raise ValueError(f"costs must be finite and >= 0; costs[{first}] = {costs[first]!r}")
        return chunk

    sums = shard_sums(c, checked)[0]
    return np.divide(sums, c, out=np.zeros(c.size), where=c > 0)


class KeepFilter:
    """Records eligible this epoch: at most ``max_tokens`` tokens, not in ``excluded``, and in
    ``draw`` (a mixture's draw of this epoch, ``planner.mixture.EpochDraw``).

    A class (not a closure) so a reader holding it stays picklable for DataLoader workers.
    """

    def __init__(
        self,
        tokens: npt.NDArray[np.integer] | None,
        max_tokens: int | None,
        excluded: Ids | None = None,
        draw: Draw | None = None,
    ) -> None:
        self.tokens = tokens
        self.max_tokens = max_tokens
        self.excluded = (
            np.empty(0, np.int64) if excluded is None else np.sort(np.asarray(excluded, np.int64))
        )
        self.draw = draw if draw is not None and draw.active else None
        if max_tokens is not None and tokens is None:
            raise ValueError("tokens are required when max_tokens is set")

    @property
    def active(self) -> bool:
        return self.max_tokens is not None or self.excluded.size > 0 or self.draw is not None

    def __call__(self, ids: Ids) -> npt.NDArray[np.bool_]:
        keep = np.ones(ids.shape, dtype=bool) if self.draw is None else self.draw(ids)
        if self.max_tokens is not None and self.tokens is not None:
            keep &= np.asarray(self.tokens[ids]) <= self.max_tokens
        if self.excluded.size:
            at = np.searchsorted(self.excluded, ids).clip(max=self.excluded.size - 1)
            keep &= self.excluded[at] != ids
        return keep

    def span(self, lo: int, hi: int) -> npt.NDArray[np.bool_]:
        """``self(np.arange(lo, hi))`` for the records [lo, hi), the tokens read as a slice
        (a range gathered by index is several times slower on a mapped index), the id range
        built only for a draw or exclusions."""
        if self.draw is None and not self.excluded.size:
            if self.max_tokens is None or self.tokens is None:
                return np.ones(hi - lo, dtype=bool)
            return np.asarray(self.tokens[lo:hi]) <= self.max_tokens
        return self(np.arange(lo, hi, dtype=np.int64))

    def too_long(self) -> Ids:
        """Ids of the records over the memory cap that the other filters keep (not excluded,
        in the draw): the ``longer_than_max_tokens`` remainder. One pass over the tokens."""
        if self.max_tokens is None or self.tokens is None:
            return np.empty(0, np.int64)
        ids = np.flatnonzero(np.asarray(self.tokens[:]) > self.max_tokens).astype(np.int64)
        return ids[KeepFilter(None, None, self.excluded, self.draw)(ids)]

    def kept_table(self, table: ShardTable, costs: npt.NDArray[np.floating]) -> ShardTable:
        """``table`` with usable counts and mean costs over the records kept.

        One chunked pass over the records when a memory cap is set; a draw alone gives its
        closed-form counts (each shard keeps its mean cost: the draw is uniform inside a shard)
        and no pass; exclusions are subtracted from that, over the excluded ids only;
        unfiltered tables are returned as they are.
        """
        if not self.active:
            return table
        if self.excluded.size:
            return self._minus_excluded(table, costs)
        counts = table.counts
        if self.max_tokens is None and self.draw is not None:
            return table.with_usable(self.draw.usable)

        def kept(lo: int, hi: int) -> npt.NDArray[np.float64]:
            mask = self.span(lo, hi)
            out = np.zeros((2, hi - lo))
            out[0] = mask
            np.copyto(out[1], np.asarray(costs[lo:hi]), where=mask)
            return out

        kept_count, sums = shard_sums(counts, kept, rows=2)
        usable = np.rint(kept_count).astype(np.int64)
        weight = np.divide(sums, usable, out=np.zeros(counts.size), where=usable > 0)
        return table.with_usable(usable, weight)

    def _minus_excluded(self, table: ShardTable, costs: npt.NDArray[np.floating]) -> ShardTable:
        """The table kept without the exclusions, less the excluded records it keeps: a pass
        over the excluded ids only (elastic resume: the records consumed under an earlier
        world size), so resuming early in an epoch does not cost a pass over every record."""
        base = KeepFilter(self.tokens, self.max_tokens, None, self.draw)
        kept = base.kept_table(table, costs)
        gone = self.excluded[base(self.excluded)]
        n = table.counts.size
        entry = np.searchsorted(np.cumsum(table.counts), gone, side="right")
        dropped = np.bincount(entry, minlength=n)
        dropped_cost = np.bincount(entry, np.asarray(costs[gone], np.float64), minlength=n)
        usable = kept.usable - dropped
        sums = np.maximum(kept.weight * kept.usable - dropped_cost, 0.0)
        weight = np.divide(sums, usable, out=np.zeros(n), where=usable > 0)
        return table.with_usable(usable, weight)


class Draw(Protocol):
    """What :class:`KeepFilter` needs of an epoch's draw (``planner.mixture.EpochDraw``)."""

    @property
    def active(self) -> bool: ...

    @property
    def usable(self) -> Ids: ...

    def __call__(self, ids: npt.ArrayLike) -> npt.NDArray[np.bool_]: ...
