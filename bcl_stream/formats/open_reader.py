"""The one place a reader is opened: one dataset in its own format, chosen from its cost index
(``bcl-stream read``, each stream of a mixture), or a mixture of streams (``BCLDataModule``,
``bcl-stream read --stream``). Readers are imported inside: ``streaming`` takes seconds to
import."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import DatasetReader, PlanDataset


def open_reader(
    location: str,
    config: ReaderConfig,
    rank: int | None,
    cache_dir: str | os.PathLike[str] | None,
    options: ReadOptions | None = None,
    *,
    format: str | None = None,
) -> DatasetReader:
    """``MDSPackDataset`` or ``WDSPackDataset`` for ``location`` (both serve every scope),
    refusing a dataset of another format than ``format`` (None: whatever the cost index says)."""
    from bcl_stream.io.remote import open_cost_index

    index, _ = open_cost_index(location, cache_dir)
    if format is not None and index.format != format:
        raise DatasetError(
            f"{location}: a {index.format} dataset (its cost index says so), but format="
            f"{format!r} was given; set format={index.format!r} or leave it out"
        )
    if index.format == "wds":
        from bcl_stream.formats.wds_reader import WDSPackDataset

        return WDSPackDataset(location, config, rank, cache_dir=cache_dir, options=options)
    from bcl_stream.formats.mds_reader import MDSPackDataset

    return MDSPackDataset(location, config, rank, cache_dir=cache_dir, options=options)


def open_dataset(
    data: str | None,
    streams: Sequence[Any] | None,
    config: ReaderConfig,
    rank: int | None,
    cache_dir: str | os.PathLike[str] | None,
    *,
    epoch_size: int | None = None,
    format: str | None = None,
    options: ReadOptions | None = None,
) -> PlanDataset:
    """The reader of one dataset (``data``) or of a mixture (``streams``: specs or dicts, each
    stream read in its own format); exactly one of the two. ``format`` checks one dataset's;
    ``options``: how a dataset's shards are fetched (one dataset)."""
    if (data is None) == (streams is None):
        raise ValueError("give either data (one dataset) or streams (a mixture), not both")
    if streams is None:
        assert data is not None
        return open_reader(data, config, rank, cache_dir, options, format=format)
    from bcl_stream.formats.mixture_reader import MixturePackDataset

    return MixturePackDataset(
        list(streams), config, rank, cache_dir=cache_dir, epoch_size=epoch_size
    )
