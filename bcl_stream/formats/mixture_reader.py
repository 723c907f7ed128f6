"""A mixture reader: one rank's packs of a mixture plan, each record read by its stream's reader.

The plan is made over the mixture ids (``bcl_stream.epoch.mixture_index.MixtureIndex``); each stream keeps
its own reader (MDS through a stock ``StreamingDataset``, WebDataset through our tar reader)
with its own cache directory, integrity checks and prefetch. For a batch of packs this reader
asks each stream's reader for that stream's records in first-needed order (each record once,
however many copies of it the packs hold) and puts them back into pack order.

Each yielded record carries ``sample_id`` (its id inside its stream, as a single-dataset reader
gives it) and ``stream`` (the stream's position in the list given).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.epoch.mixture_index import MixtureIndex, StreamSpec
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.formats.reader_base import Pack, PlanDataset


class MixturePackDataset(PlanDataset):
    """One rank's packs of a mixture of streams (``StreamSpec``s or ``PATH[:key=value]``).

    ``cache_dir``: required when a stream is remote; each stream caches under its own
    subdirectory ``stream-<i>``. ``epoch_size``: records per epoch with proportions (default:
    every stream's records once, Mosaic Streaming's default).
    """

    def __init__(
        self,
        streams: Sequence[StreamSpec | str | dict[str, Any]],
        config: ReaderConfig,
        rank: int | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        epoch_size: int | None = None,
    ) -> None:
        specs = [StreamSpec.of(s) for s in streams]
        if not specs:
            raise ValueError("a mixture needs at least one stream")
        self.readers = [
            open_reader(
                spec.path,
                config,
                rank,
                None if cache_dir is None else str(Path(cache_dir) / f"stream-{i}"),
            )
            for i, spec in enumerate(specs)
        ]
        index = MixtureIndex(specs, [r.index for r in self.readers], epoch_size=epoch_size)
        super().__init__(index, config, rank)
        self.mixture = index
        self.location = ",".join(spec.path for spec in specs)

    def describe_mixture(self) -> list[dict[str, Any]]:
        """The mixture as a cursor records it (paths, weights, fingerprints)."""
        return self.mixture.describe()

    def _read_packs(self, packs: npt.NDArray[np.int64]) -> Iterator[Pack]:
        stream, local = self.mixture.locate(packs)
        records: dict[int, dict[int, dict[str, Any]]] = {}
        pulls: dict[int, Iterator[Pack]] = {}
        order: dict[int, Iterator[int]] = {}
        for s in np.unique(stream).tolist():
            ids = local[stream == s]  # pack order (row-major), copies included
            first = np.unique(ids, return_index=True)[1]
            wanted = ids[np.sort(first)]
            pulls[s] = self.readers[s]._read_packs(wanted.reshape(-1, 1))
            order[s] = iter(wanted.tolist())
            records[s] = {}
        for row_streams, row_ids in zip(stream.tolist(), local.tolist(), strict=True):
            pack: Pack = []
            for s, sid in zip(row_streams, row_ids, strict=True):
                held = records[s]
                while sid not in held:  # the stream's next record in first-needed order
                    got = next(order[s])
                    held[got] = next(pulls[s])[0]
                record = dict(held[sid])
                record["stream"] = s
                pack.append(record)
            yield pack
        for pull in pulls.values():  # let readers release prefetchers and files
            close = getattr(pull, "close", None)  # generators (every reader's) have one
            if close is not None:
                close()
