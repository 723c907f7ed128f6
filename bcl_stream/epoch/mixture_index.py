"""Mixtures: several costed datasets (streams) read as one, each with its share of the epoch.

A user names streams as Mosaic Streaming's ``Stream`` does: a location plus at most one of
``proportion``, ``repeat`` or ``choose`` (semantics in :func:`bcl_stream.planner.mixture.
choose_counts`, docs/mixtures.md), and optionally a cost model of its own (a long-context or
multimodal source can cost differently per token). :class:`MixtureIndex` presents the streams'
cost indexes to the planner as one index over the mixture ids of
:class:`~bcl_stream.planner.mixture.MixtureLayout`: costs and tokens are views that gather
from each stream's memory-mapped index, so nothing per process grows with the data.

On the command line a stream is ``PATH[:key=value[,key=value]]``, for example
``s3://bucket/code:proportion=0.3`` or ``data/chat:repeat=2,cost_model=long.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel, resolve
from bcl_stream.io.index import CostIndex
from bcl_stream.planner import ShardTable, shard_weights
from bcl_stream.planner.mixture import EpochDraw, MixtureLayout, choose_counts

WEIGHT_KEYS = ("proportion", "repeat", "choose")
STREAM_KEYS = (*WEIGHT_KEYS, "cost_model")


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One stream of a mixture: where it is and how much of it an epoch takes."""

    path: str
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    cost_model: str | None = None
    """Preset name or JSON path for this stream's costs (default: the reader's cost model, or
    the costs stored in the stream's index)."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"stream path must be a non-empty string, got {self.path!r}")
        given = [k for k in WEIGHT_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"stream {self.path}: set at most one of {WEIGHT_KEYS}, got {given}")
        for key in ("proportion", "repeat"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not np.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"stream {self.path}: {key} must be a number > 0, got {value!r}")
        if self.choose is not None and (
            isinstance(self.choose, bool) or not isinstance(self.choose, int) or self.choose < 1
        ):
            raise ValueError(
                f"stream {self.path}: choose must be an integer >= 1, got {self.choose!r}"
            )
        if self.cost_model is not None and not isinstance(self.cost_model, str):
            raise ValueError(f"stream {self.path}: cost_model must be a string")

    @classmethod
    def parse(cls, text: str) -> StreamSpec:
        """``PATH[:key=value[,key=value]]`` (keys: proportion, repeat, choose, cost_model).

        Only a suffix after the last ``:`` that holds ``=`` is options, so ``s3://bucket/x``
        is a path."""
        path, sep, options = text.rpartition(":")
        if not sep or "=" not in options or "/" in options.split("=", 1)[0]:
            return cls(text)
        values: dict[str, Any] = {}
        for item in options.split(","):
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq or key not in STREAM_KEYS:
                raise ValueError(
                    f"--stream {text}: {item!r} is not key=value with a key among {STREAM_KEYS}"
                )
            if key in values:
                raise ValueError(f"--stream {text}: {key} given twice")
            try:
                values[key] = (
                    raw if key == "cost_model" else int(raw) if key == "choose" else float(raw)
                )
            except ValueError as exc:
                raise ValueError(f"--stream {text}: {key}={raw!r} is not a number") from exc
        return cls(path, **values)

    @classmethod
    def of(cls, value: StreamSpec | str | dict[str, Any]) -> StreamSpec:
        """A spec from itself, the command-line text or a dict (YAML configs)."""
        if isinstance(value, StreamSpec):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            unknown = set(value) - {"path", *STREAM_KEYS}
            if unknown or "path" not in value:
                raise ValueError(
                    f"stream {value!r}: needs 'path' and at most {STREAM_KEYS}; unknown keys "
                    f"{sorted(unknown)}"
                )
            return cls(**value)
        raise ValueError(f"a stream is a path string or a dict, got {type(value).__name__}")

    def weight(self) -> dict[str, Any]:
        """The setting that decides this stream's share (empty: one copy per epoch)."""
        return {k: getattr(self, k) for k in WEIGHT_KEYS if getattr(self, k) is not None}

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


class SegmentArray:
    """A read-only 1-D view of per-stream arrays in mixture-id order (costs, tokens).

    Indexing by slices, integers and integer arrays of any shape gathers from each stream's
    array (memory-mapped ones stay mapped), which is all the planner does with costs."""

    ndim = 1

    def __init__(self, layout: MixtureLayout, parts: Sequence[npt.NDArray[Any]]) -> None:
        self._layout = layout
        self._parts = list(parts)
        self._starts = layout.segment_starts
        self._ends = self._starts + layout.records[layout.segment_stream]
        self._segment_stream = layout.segment_stream
        self.dtype = np.result_type(*[p.dtype for p in parts])
        self.shape = (layout.n_records,)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def parts(self) -> list[npt.NDArray[Any]]:
        """The per-stream arrays, in stream order."""
        return self._parts

    @property
    def size(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.shape[0])
            if step != 1:
                return self[np.arange(lo, hi, step, dtype=np.int64)]
            pieces = []
            for seg in range(self._starts.size):
                a, b = max(lo, int(self._starts[seg])), min(hi, int(self._ends[seg]))
                if a < b:
                    part = self._parts[int(self._segment_stream[seg])]
                    base = int(self._starts[seg])
                    pieces.append(np.asarray(part[a - base : b - base], dtype=self.dtype))
            return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)
        if isinstance(key, int | np.integer):
            index = int(key) + (self.shape[0] if int(key) < 0 else 0)
            stream, local = self._layout.locate(np.array([index]))
            return self._parts[int(stream[0])][int(local[0])]
        ids = np.asarray(key, dtype=np.int64)
        stream, local = self._layout.locate(ids)
        out = np.empty(ids.shape, dtype=self.dtype)
        for s in np.unique(stream):
            sel = stream == s
            out[sel] = self._parts[int(s)][local[sel]]
        return out


class MixtureIndex:
    """Several streams' cost indexes as the one index the planner reads (duck-compatible with
    :class:`~bcl_stream.io.index.CostIndex` where plans use it: ``len``, ``shard_counts``,
    ``tokens``, ``costs()``, ``fingerprint()``)."""

    format = "mixture"

    def __init__(
        self,
        specs: Sequence[StreamSpec],
        indexes: Sequence[CostIndex],
        *,
        epoch_size: int | None = None,
    ) -> None:
        if not specs or len(specs) != len(indexes):
            raise ValueError(f"{len(specs)} stream specs for {len(indexes)} cost indexes")
        paths = [s.path for s in specs]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a stream is named twice: {paths}")
        self.specs = tuple(specs)
        self.indexes = tuple(indexes)
        self.epoch_size = epoch_size
        try:
            choose = choose_counts(
                [len(ix) for ix in indexes],
                proportion=[s.proportion for s in specs],
                repeat=[s.repeat for s in specs],
                choose=[s.choose for s in specs],
                epoch_size=epoch_size,
            )
        except ValueError as exc:
            raise ValueError(f"mixture of {paths}: {exc}") from exc
        self.layout = MixtureLayout.build([ix.shard_counts for ix in indexes], choose)
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return self.layout.n_records

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (self.specs, self.indexes, self.epoch_size)

    @property
    def shard_counts(self) -> list[int]:
        return [int(c) for c in self.layout.table_counts]

    @property
    def tokens(self) -> SegmentArray:
        return SegmentArray(self.layout, [ix.tokens for ix in self.indexes])

    def stream_models(self, model: CostModel | None) -> list[CostModel | None]:
        """Each stream's cost model: its own, else ``model`` (None: the stored costs)."""
        return [model if s.cost_model is None else resolve(s.cost_model) for s in self.specs]

    def costs(self, model: CostModel | None = None) -> SegmentArray:
        """Per-record costs by mixture id, each stream under its own cost model."""
        models = self.stream_models(model)
        return SegmentArray(
            self.layout, [ix.costs(m) for ix, m in zip(self.indexes, models, strict=True)]
        )

    def shard_table(self, costs: SegmentArray) -> ShardTable:
        """The mixture's shard table from its costs (:meth:`costs`): one chunked pass over
        each stream's costs, which are computed once (a cost model other than the stored one
        recomputes every record's cost)."""
        weights = [
            shard_weights(ix.shard_counts, part)
            for ix, part in zip(self.indexes, costs.parts, strict=True)
        ]
        return self.layout.table(weights)

    def draw(self, seed: int, epoch: int) -> EpochDraw:
        """The ids of ``epoch`` (whole copies plus each stream's cyclic draw)."""
        return self.layout.draw(seed, epoch)

    def locate(self, ids: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(stream, record id inside the stream) of mixture ids."""
        return self.layout.locate(ids)

    def fingerprint(self) -> str:
        """Changes with any stream's data, weight, cost model or order (plans depend on all)."""
        if self._fingerprint is None:
            body = json.dumps(self.describe(), sort_keys=True)
            self._fingerprint = "mix-" + hashlib.sha256(body.encode()).hexdigest()[:16]
        return self._fingerprint

    def describe(self) -> list[dict[str, Any]]:
        """One dict per stream, in order: what a cursor records and ``plan --json`` prints."""
        return [
            {
                "path": spec.path,
                **spec.weight(),
                "cost_model": spec.cost_model,
                "records": len(ix),
                "records_per_epoch": int(c),
                "fingerprint": ix.fingerprint(),
                **({"epoch_size": self.epoch_size} if self.epoch_size is not None else {}),
            }
            for spec, ix, c in zip(self.specs, self.indexes, self.layout.choose, strict=True)
        ]


def _rebuild(
    specs: tuple[StreamSpec, ...], indexes: tuple[CostIndex, ...], epoch_size: int | None
) -> MixtureIndex:
    return MixtureIndex(specs, indexes, epoch_size=epoch_size)


def mixture_changes(saved: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """What differs between two mixture descriptions (:meth:`MixtureIndex.describe`), in
    words, one item per change; empty when they are the same."""
    changes: list[str] = []
    old = {s.get("path"): s for s in saved}
    new = {s.get("path"): s for s in current}
    for path in old.keys() - new.keys():
        changes.append(f"stream {path} removed")
    for path in new.keys() - old.keys():
        changes.append(f"stream {path} added")
    for path in old.keys() & new.keys():
        a, b = old[path], new[path]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                what = "data (fingerprint)" if key == "fingerprint" else key
                changes.append(f"stream {path}: {what} {a.get(key)!r} -> {b.get(key)!r}")
    if not changes and [s.get("path") for s in saved] != [s.get("path") for s in current]:
        changes.append("stream order changed")
    return sorted(changes)
