"""A mixture of datasets as one record space the planner reads, and each epoch's draw of it.

A mixture is a list of streams (datasets), each with a number of records per epoch
(``choose``: Mosaic Streaming's proportion, repeat and choose all reduce to it). The planner
sees one id space, the **mixture ids**: stream s takes ``copies(s) = ceil(choose / records)``
consecutive copies of its records (copy c of record i is one id), streams in the order given.
Only ``choose`` of a stream's ``copies * records`` ids are in an epoch: every whole copy but
the last, and of the last copy the records :class:`EpochDraw` draws. The planner handles the
draw as it handles the memory cap, a filter with per-shard usable counts, so everything
downstream (node streams, windows, pack counts, resume) is unchanged and the pack count still
comes from the index alone: the draw's per-shard counts are closed-form, no pass over records.

Sampling is per shard and **cyclic**: a shard of n records that gives k records an epoch
takes positions [o, o + k) (mod n) of one fixed random order of its records, o advancing by k
each epoch. Each shard's draws through any epoch stay within one record of its share
(:func:`_cyclic_draw`), so every record of a stream is drawn once before any is drawn twice,
and across epochs draws differ by at most one per record; Streaming's ``balanced`` sampling
redraws independently each epoch, so a record can wait several epochs. The count of an epoch
is ``choose`` give or take a few records (the per-shard rounding; at most one per shard).
Everything is a pure function of (seed, epoch) and the record counts.

Streams also label shards (:attr:`ShardTable.stream`): the order deals every stream's shards
to nodes and groups separately and the stratified shuffle keeps each stream's share in every
window (``stratify.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.planner import checks
from bcl_stream.planner.rng import Tag, epoch_rng
from bcl_stream.planner.shard_table import Ids, ShardTable


def choose_counts(
    records: Sequence[int],
    *,
    proportion: Sequence[float | None],
    repeat: Sequence[float | None],
    choose: Sequence[int | None],
    epoch_size: int | None = None,
) -> list[int]:
    """Records per epoch of each stream, with Mosaic Streaming's semantics.

    Each stream sets at most one of ``proportion`` (a share of the epoch), ``repeat`` (copies of
    the stream per epoch, fractional allowed) or ``choose`` (records per epoch). Proportions
    (relative) and repeat/choose (absolute) cannot be mixed. With proportions the epoch holds
    ``epoch_size`` records (default: every stream's records once), split by the normalized
    proportions, rounded so they add up exactly; streams without a setting take ``repeat=1``.
    """
    n = len(records)
    if not (len(proportion) == len(repeat) == len(choose) == n) or n == 0:
        raise ValueError("one proportion, repeat and choose entry per stream, at least one stream")
    for i, r in enumerate(records):
        checks.integer(r, f"stream {i} records", 1)
    for i in range(n):
        given = [x is not None for x in (proportion[i], repeat[i], choose[i])]
        if sum(given) > 1:
            raise ValueError(
                f"stream {i}: set at most one of proportion, repeat and choose, got "
                f"{[k for k, g in zip(('proportion', 'repeat', 'choose'), given, strict=True) if g]}"
            )
    relative = [p is not None for p in proportion]
    if any(relative):
        if not all(relative):
            missing = [i for i, r in enumerate(relative) if not r]
            raise ValueError(
                f"streams {missing} have no proportion: proportions (relative) cannot be mixed "
                "with repeat/choose (absolute); give every stream a proportion or none"
            )
        shares = np.array([float(p) for p in proportion if p is not None])
        if not np.all(np.isfinite(shares)) or np.any(shares <= 0):
            raise ValueError(f"proportions must be finite and > 0, got {shares.tolist()}")
        total = int(sum(records)) if epoch_size is None else epoch_size
        checks.integer(total, "epoch_size", 1)
        exact = shares / shares.sum() * total
        counts = np.floor(exact).astype(np.int64)
        rest = total - int(counts.sum())
        counts[np.argsort(-(exact - counts), kind="stable")[:rest]] += 1
        if np.any(counts == 0):
            raise ValueError(
                f"epoch_size {total} gives stream {int(np.flatnonzero(counts == 0)[0])} no records"
            )
        return [int(c) for c in counts]
    if epoch_size is not None:
        raise ValueError("epoch_size only applies to proportions; repeat/choose are absolute")
    out: list[int] = []
    for i, r in enumerate(records):
        c, rep = choose[i], repeat[i]
        if c is not None:
            checks.integer(c, f"stream {i} choose", 1)
            out.append(int(c))
        elif rep is not None:
            if not (isinstance(rep, int | float) and np.isfinite(rep) and rep > 0):
                raise ValueError(f"stream {i}: repeat must be a number > 0, got {rep!r}")
            out.append(max(1, round(float(rep) * int(r))))
        else:
            out.append(int(r))
    return out


@dataclass(frozen=True, eq=False)
class MixtureLayout:
    """Where each stream's copies lie in the mixture id space (O(streams x shards)).

    The derived arrays are computed once (``cached_property``): :meth:`locate` runs for every
    gather of costs the planner makes."""

    shard_counts: tuple[Ids, ...]
    """Records per shard of each stream, in write order."""
    choose: Ids
    """Records per epoch of each stream."""

    @classmethod
    def build(cls, shard_counts: Sequence[npt.ArrayLike], choose: Sequence[int]) -> MixtureLayout:
        counts = tuple(
            checks.array(c, f"stream {i} shard counts", whole=True)
            for i, c in enumerate(shard_counts)
        )
        pick = checks.array(choose, "choose", whole=True)
        if pick.size != len(counts) or not counts:
            raise ValueError(f"{len(counts)} streams but {pick.size} choose counts")
        for i, c in enumerate(counts):
            if c.size == 0 or np.any(c < 0) or int(c.sum()) == 0:
                raise ValueError(f"stream {i} has no records")
        if np.any(pick < 1):
            raise ValueError(f"every stream must give >= 1 record per epoch, got {pick.tolist()}")
        return cls(counts, pick)

    @property
    def n_streams(self) -> int:
        return len(self.shard_counts)

    @cached_property
    def records(self) -> Ids:
        """Records of each stream (one copy)."""
        return np.array([int(c.sum()) for c in self.shard_counts], dtype=np.int64)

    @cached_property
    def copies(self) -> Ids:
        """Copies of each stream in the id space: ceil(choose / records)."""
        return -(-self.choose // self.records)

    @cached_property
    def segment_stream(self) -> Ids:
        """Stream of each segment (one segment = one copy of one stream), in id order."""
        return np.repeat(np.arange(self.n_streams, dtype=np.int64), self.copies)

    @cached_property
    def segment_starts(self) -> Ids:
        """First mixture id of each segment."""
        sizes = self.records[self.segment_stream]
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    @cached_property
    def n_records(self) -> int:
        """Ids in the mixture space (every copy of every stream)."""
        return int((self.records * self.copies).sum())

    @cached_property
    def table_counts(self) -> Ids:
        """Records per shard of the mixture's shard table: every copy's shards, in id order."""
        return np.concatenate([self.shard_counts[s] for s in self.segment_stream])

    def table_streams(self) -> Ids:
        """Stream of each shard of the mixture's table."""
        return self._table_streams

    @cached_property
    def _table_streams(self) -> Ids:
        return np.concatenate(
            [np.full(self.shard_counts[s].size, s, np.int64) for s in self.segment_stream]
        )

    def table(self, weights: Sequence[npt.NDArray[np.float64]]) -> ShardTable:
        """The mixture's shard table from each stream's mean cost per shard (one copy)."""
        weight = np.concatenate([weights[s] for s in self.segment_stream])
        return ShardTable.build(
            self.table_counts, weight=weight, stream=self.table_streams(), origin=self.origins()
        )

    def origins(self) -> Ids:
        """For each shard of the mixture's table, the entry of the same shard in its stream's
        first copy (-1 for the first copy itself): copies of a shard share its node."""
        sizes = np.array([self.shard_counts[s].size for s in self.segment_stream], np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.full(int(sizes.sum()), -1, dtype=np.int64)
        first: dict[int, int] = {}
        for seg, s in enumerate(self.segment_stream.tolist()):
            if s in first:
                out[starts[seg] : starts[seg] + sizes[seg]] = np.arange(sizes[seg]) + first[s]
            else:
                first[s] = int(starts[seg])
        return out

    def locate(self, ids: npt.ArrayLike) -> tuple[Ids, Ids]:
        """(stream, id inside the stream) of each mixture id."""
        v = np.asarray(ids, dtype=np.int64)
        starts = self.segment_starts
        seg = np.searchsorted(starts, v, side="right") - 1
        return self.segment_stream[seg], v - starts[seg]

    def stream_of(self, ids: npt.ArrayLike) -> Ids:
        return self.locate(ids)[0]

    def draw(self, seed: int, epoch: int) -> EpochDraw:
        return EpochDraw(self, seed, epoch)


class EpochDraw:
    """The ids of one epoch: whole copies plus a cyclic per-shard draw from each last copy.

    ``usable`` (per shard of the mixture table) is closed-form; :meth:`__call__` is the mask
    of any ids, O(shard) per shard touched (a cached order of the shard's records).
    """

    CACHE = 8

    def __init__(self, layout: MixtureLayout, seed: int, epoch: int) -> None:
        checks.integer(seed, "seed", 0, (1 << 128) - 1)
        checks.integer(epoch, "epoch", 0)
        self.layout, self.seed, self.epoch = layout, seed, epoch
        counts = layout.table_counts
        self._ends = np.cumsum(counts)
        self._counts = counts
        self._streams = layout.table_streams()
        take = counts.copy()
        offset = np.zeros(counts.size, dtype=np.int64)
        partial = np.zeros(counts.size, dtype=bool)
        # Which table shard is stream s's shard j of its last copy.
        self._shard_in_stream = np.concatenate(
            [np.arange(layout.shard_counts[s].size, dtype=np.int64) for s in layout.segment_stream]
        )
        first = 0
        for s in range(layout.n_streams):
            n_shards = layout.shard_counts[s].size
            last = first + (int(layout.copies[s]) - 1) * n_shards
            rest = int(layout.choose[s]) - (int(layout.copies[s]) - 1) * int(layout.records[s])
            if rest < int(layout.records[s]):
                sl = slice(last, last + n_shards)
                k, o = _cyclic_draw(layout.shard_counts[s], rest, seed, epoch, s)
                take[sl], offset[sl], partial[sl] = k, o, True
            first += int(layout.copies[s]) * n_shards
        self.usable = take
        """Records of each mixture-table shard in this epoch's draw."""
        self._offset, self._partial = offset, partial
        self._orders: OrderedDict[int, Ids] = OrderedDict()

    @property
    def active(self) -> bool:
        """Whether some records are left out (a stream draws less than whole copies)."""
        return bool(self._partial.any())

    def per_stream(self) -> Ids:
        """Records each stream gives this epoch (``layout.choose`` give or take the per-shard
        rounding of :func:`_cyclic_draw`)."""
        return np.bincount(
            self._streams, weights=self.usable, minlength=self.layout.n_streams
        ).astype(np.int64)

    def _rank(self, shard: int) -> Ids:
        """Position of each of the shard's records in its fixed random order (cached)."""
        hit = self._orders.get(shard)
        if hit is None:
            stream = int(self._streams[shard])
            n = int(self._counts[shard])
            rng = epoch_rng(
                self.seed, 0, Tag.MIXTURE_DRAW, stream, int(self._shard_in_stream[shard])
            )
            hit = np.empty(n, dtype=np.int64)
            hit[rng.permutation(n)] = np.arange(n, dtype=np.int64)
            self._orders[shard] = hit
            while len(self._orders) > self.CACHE:
                self._orders.popitem(last=False)
        else:
            self._orders.move_to_end(shard)
        return hit

    def __call__(self, ids: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which of ``ids`` (mixture ids) are in this epoch's draw."""
        v = np.asarray(ids, dtype=np.int64)
        keep = np.ones(v.shape, dtype=bool)
        if not self.active or v.size == 0:
            return keep
        flat, out = v.reshape(-1), keep.reshape(-1)
        shard = np.searchsorted(self._ends, flat, side="right")
        drawn = self._partial[shard]
        for sh in np.unique(shard[drawn]):
            sel = np.flatnonzero(shard == sh)
            n = int(self._counts[sh])
            local = flat[sel] - (int(self._ends[sh]) - n)
            rank = self._rank(int(sh))[local]
            out[sel] = (rank - self._offset[sh]) % n < self.usable[sh]
        return keep

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = OrderedDict()  # a cache: workers rebuild what they touch
        return state


def _cyclic_draw(counts: Ids, rest: int, seed: int, epoch: int, stream: int) -> tuple[Ids, Ids]:
    """(records drawn from each shard this epoch, where in the shard's cycle they start).

    Shard i of n_i records (of N in the stream) is owed ``rest * n_i / N`` records an epoch.
    Its draws through epoch e are ``T_i(e) = floor((e * rest * n_i + U_i) / N)`` with a fixed
    random phase U_i in [0, N): always within one record of what it is owed, so every shard
    (and every record, the draws cycling through the shard) is drawn at its share, and the
    epoch's total is ``rest`` give or take the phases' rounding (a few records, at most one
    per shard). Integer arithmetic: the same on every machine."""
    n = counts.astype(np.int64)
    total = int(n.sum())
    phase = epoch_rng(seed, 0, Tag.MIXTURE_DRAW, stream).integers(0, total, size=n.size)

    def drawn_through(e: int) -> Ids:
        whole, part = divmod(e * rest, total)  # e * rest * n_i = (whole * N + part) * n_i
        return whole * n + (part * n + phase) // total

    before = drawn_through(epoch)
    take = drawn_through(epoch + 1) - before
    offset = np.where(n > 0, before % np.maximum(n, 1), 0)
    return take, offset
