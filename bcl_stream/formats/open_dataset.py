"""The one place a reader is opened for a user: one dataset in its own format, or a mixture of
streams (``BCLDataModule``, ``bcl-stream read``, ``bcl_stream.open_dataset``).

It sits above every reader: it imports the single-dataset opener
(:mod:`bcl_stream.formats.open_reader`) and the mixture reader, and no reader imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mixture_reader import MixturePackDataset
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import PlanDataset


def open_dataset(
    data: str | None,
    streams: Sequence[Any] | None,
    config: ReaderConfig,
    rank: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    epoch_size: int | None = None,
    format: str | None = None,
    options: ReadOptions | None = None,
) -> PlanDataset:
    """The reader of one dataset (``data``) or of a mixture (``streams``: specs or dicts, each
    stream read in its own format); exactly one of the two. ``rank``: the data-parallel rank
    (None: the process group's, else env ``RANK``); ``cache_dir``: the node's cache, required
    for a remote dataset. ``format`` checks one dataset's; ``options``: how a dataset's shards
    are fetched (one dataset)."""
    if (data is None) == (streams is None):
        raise ValueError("give either data (one dataset) or streams (a mixture), not both")
    if streams is None:
        assert data is not None
        return open_reader(data, config, rank, cache_dir, options, format=format)
    return MixturePackDataset(
        list(streams), config, rank, cache_dir=cache_dir, epoch_size=epoch_size
    )
