"""The one place a reader is opened for a user: one dataset in its own format, or a mixture of
streams (``BCLDataModule``, ``bcl-stream read``, ``bcl_stream.open_dataset``).

It sits above every reader: it imports the single-dataset opener
(:mod:`bcl_stream.formats.open_reader`) and the mixture reader, and no reader imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bcl_stream.epoch.mixture_index import StreamSpec
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mixture_reader import MixturePackDataset
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import PlanDataset


def open_dataset(
    data: str | os.PathLike[str] | Sequence[StreamSpec | str | dict[str, Any]] | None,
    config: ReaderConfig,
    rank: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    epoch_size: int | None = None,
    format: str | None = None,
    options: ReadOptions | None = None,
) -> PlanDataset:
    """The reader of ``data``: one dataset (its location: a directory or a remote URL, read in
    the format its cost index says) or a mixture (a list of streams: ``StreamSpec``s,
    ``PATH[:key=value]`` strings or dicts, each stream read in its own format).

    ``rank``: the data-parallel rank (None: the process group's, else env ``RANK``);
    ``cache_dir``: the node's cache, required for a remote dataset. One dataset: ``format``
    checks its format, ``options`` says how its shards are fetched. A mixture: ``epoch_size``
    records per epoch with proportions (None: every stream's records once). ``data=None``
    (an optional setting left unset) is refused with what to give.
    """
    if isinstance(data, str | os.PathLike):
        return open_reader(os.fspath(data), config, rank, cache_dir, options, format=format)
    if not isinstance(data, Sequence) or not data:
        raise ValueError(
            "data must be a dataset location or a non-empty list of streams, got "
            f"{type(data).__name__} {data!r}"
        )
    return MixturePackDataset(list(data), config, rank, cache_dir=cache_dir, epoch_size=epoch_size)
