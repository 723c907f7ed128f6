"""The reader of a dataset in its own format, chosen from its cost index (one place for it:
``bcl-stream read``, each stream of a mixture)."""

from __future__ import annotations

import os

from bcl_stream.formats.reader_base import DatasetReader
from bcl_stream.plan.checks import check_format_scope
from bcl_stream.plan.epoch import ReaderConfig


def open_reader(
    location: str,
    config: ReaderConfig,
    rank: int | None,
    cache_dir: str | os.PathLike[str] | None,
) -> DatasetReader:
    """``MDSPackDataset`` or ``WDSPackDataset`` for ``location``, refusing a scope its reader
    cannot serve (WebDataset: rank only) with the planning error. Readers are imported here:
    ``streaming`` takes seconds to import."""
    from bcl_stream.io.remote import open_cost_index

    index, _ = open_cost_index(location, cache_dir)
    check_format_scope(location, index.format, config.plan.scope)
    if index.format == "wds":
        from bcl_stream.formats.wds_reader import WDSPackDataset

        return WDSPackDataset(location, config, rank, cache_dir=cache_dir)
    from bcl_stream.formats.mds_reader import MDSPackDataset

    return MDSPackDataset(location, config, rank, cache_dir=cache_dir)
