"""Plan what is trained: records longer than ``max_seq_len`` at the length they are fed.

Why: the collate keeps a record's first ``max_seq_len`` tokens, so a 108,559-token record
truncated to 8,192 costs what 8,192 tokens cost. Planned at its full length it would make its
pack look like a straggler that never happens and starve the other ranks of that step. With
``ReaderConfig.max_seq_len`` set, every per-record array the planner reads is the fed one:
costs (the record's cost model applied to min(L, max_seq_len)), tokens (for the memory cap)
and trained tokens (the loss denominator, ``loss_tokens.py``).

The arrays are the cost index's own (memory-mapped) where nothing is cut; otherwise a copy
of the column with the long records replaced (4 B per record, once per process, in the plan
cache). A mixture is handled stream by stream, each under its own cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel
from bcl_stream.epoch.cache import cached
from bcl_stream.epoch.mixture_index import MixtureIndex, SegmentArray
from bcl_stream.io.index import CostIndex

Data = CostIndex | MixtureIndex
CHUNK = 1 << 20
"""Records scanned at a time for the truncation report (a few MB of scratch)."""


@dataclass(frozen=True, slots=True)
class Truncation:
    """What ``max_seq_len`` cuts from a dataset (every record, once: not an epoch's draw)."""

    max_seq_len: int | None
    records: int
    """Records longer than ``max_seq_len``."""
    tokens: int
    """Tokens cut from them in all."""
    unknown_trained: int = 0
    """Truncated records whose trained count after the cut the cost index cannot give (a mask
    that trains some but not all of their tokens: the spans are read with the record)."""
    long_ids: tuple[npt.NDArray[np.int64], ...] = field(default=(), compare=False, repr=False)
    """The ids of those records within each stream (one array per stream), found by the one
    scan that counts them, so the fed columns replace them without scanning again."""

    def describe(self) -> str:
        """One phrase for the set-up line."""
        if self.max_seq_len is None:
            return "no max_seq_len: records are trained whole"
        if not self.records:
            return f"max_seq_len={self.max_seq_len}: no record is longer"
        return (
            f"max_seq_len={self.max_seq_len}: {self.records} records longer are truncated "
            f"({self.tokens} tokens cut) and planned at their truncated cost"
        )


def _parts(index: Data) -> list[CostIndex]:
    return list(index.indexes) if isinstance(index, MixtureIndex) else [index]


def _join(index: Data, parts: list[npt.NDArray[Any]]) -> Any:
    return SegmentArray(index.layout, parts) if isinstance(index, MixtureIndex) else parts[0]


def truncation(index: Data, max_seq_len: int | None) -> Truncation:
    """What ``max_seq_len`` cuts from ``index`` (cached per index and length)."""
    if max_seq_len is None:
        return Truncation(None, 0, 0)

    def make() -> Truncation:
        records = cut = unknown = 0
        long_ids = []
        for ix in _parts(index):
            found = []
            for start in range(0, len(ix), CHUNK):  # bounded scratch, whatever the dataset
                tokens = np.asarray(ix.tokens[start : start + CHUNK])
                long = np.flatnonzero(tokens > max_seq_len)
                if not long.size:
                    continue
                length = tokens[long].astype(np.int64)
                # CostIndex.trained: an older format gives max(L - 1, 0), trained without a mask
                trained = np.asarray(ix.trained[start + long], dtype=np.int64)
                records += int(long.size)
                cut += int((length - max_seq_len).sum())
                unknown += int(np.count_nonzero((trained > 0) & (trained < length - 1)))
                found.append(start + long)
            ids = np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)
            ids.flags.writeable = False
            long_ids.append(ids)
        return Truncation(max_seq_len, records, cut, unknown, tuple(long_ids))

    return cached(("truncation", index.fingerprint(), max_seq_len), make)


def fed_tokens(index: Data, max_seq_len: int | None) -> Any:
    """Tokens per record as fed: min(L, max_seq_len) (the index's own column if none is cut)."""
    if max_seq_len is None or not truncation(index, max_seq_len).records:
        return index.tokens

    def make() -> Any:
        parts = []
        for ix in _parts(index):
            parts.append(np.minimum(ix.tokens, np.uint32(max_seq_len)))
            parts[-1].flags.writeable = False
        return _join(index, parts)

    return cached(("fed_tokens", index.fingerprint(), max_seq_len), make)


def fed_costs(
    index: Data, models: list[CostModel | None], costs: Any, max_seq_len: int | None
) -> Any:
    """``costs`` (by record id, each stream's under ``models[i]``, None: its stored model) with
    every record longer than ``max_seq_len`` costed at ``max_seq_len`` tokens."""
    report = truncation(index, max_seq_len)
    if max_seq_len is None or not report.records:
        return costs
    given = costs.parts if isinstance(costs, SegmentArray) else [costs]
    parts = []
    for ix, model, part, long in zip(_parts(index), models, given, report.long_ids, strict=True):
        if not long.size:
            parts.append(part)
            continue
        out = np.array(part, dtype=np.float32, copy=True)
        out[long] = (model or ix.cost_model).cost(max_seq_len)
        out.flags.writeable = False
        parts.append(out)
    return _join(index, parts)


def fed_trained(index: Data, max_seq_len: int | None) -> Any | None:
    """Trained tokens per record after the cut, or None where the cost index cannot give them
    exactly (:attr:`Truncation.unknown_trained`). A record whose every position t >= 1 is
    trained keeps max_seq_len - 1 targets, one with none keeps 0."""
    report = truncation(index, max_seq_len)
    if report.unknown_trained:
        return None
    if max_seq_len is None or not report.records:
        return _join(index, [ix.trained for ix in _parts(index)])

    def make() -> Any:
        parts = []
        for ix, long in zip(_parts(index), report.long_ids, strict=True):
            trained = np.array(ix.trained, dtype=np.uint32, copy=True)
            trained[long] = np.where(trained[long] > 0, max_seq_len - 1, 0)
            trained.flags.writeable = False
            parts.append(trained)
        return _join(index, parts)

    return cached(("fed_trained", index.fingerprint(), max_seq_len), make)
