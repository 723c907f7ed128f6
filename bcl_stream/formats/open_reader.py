"""The reader of one dataset in its own format, chosen from its cost index: what
``bcl-stream read`` opens, and what the mixture reader opens for each of its streams.

Below :mod:`bcl_stream.formats.open_dataset` (one dataset or a mixture), which imports this
module and the mixture reader; the readers never import either. Importing it costs torch (the
readers are torch datasets), not streaming: the MDS reader imports streaming when it opens.
"""

from __future__ import annotations

import os

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import DatasetReader
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.remote import open_cost_index


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
    limits = (options or ReadOptions()).download_limits()
    index, _ = open_cost_index(location, cache_dir, **limits)
    if format is not None and index.format != format:
        raise DatasetError(
            f"{location}: a {index.format} dataset (its cost index says so), but format="
            f"{format!r} was given; set format={index.format!r} or leave it out"
        )
    reader = WDSPackDataset if index.format == "wds" else MDSPackDataset
    return reader(location, config, rank, cache_dir=cache_dir, options=options)
