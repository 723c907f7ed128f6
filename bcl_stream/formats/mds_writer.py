"""A costed MDS writer: streaming's ``MDSWriter`` plus the cost index, written in the safe order.

Why a subclass and not a wrapper: ``MDSWriter`` already owns shard rollover, compression,
hashing and background uploads; we only need (1) the token count of each record as it is
written and (2) a different ending. The ending, :meth:`CostedMDSWriter.write_dataset_index`,
replaces streaming's own index writing through ``streaming_compat.own_index_writing`` (the
one module that touches streaming's internals; streaming is pinned exactly):

1. wait for every shard upload to finish (stock streaming only waits for the queue to drain,
   so ``index.json`` can overtake the last shard);
2. write ``bcl_costs.npy`` + ``bcl_index.json`` and upload them;
3. write ``index.json`` with one top-level pointer key and upload it last.

Readers take ``index.json`` as "dataset complete", so a dataset is never visible without its
costs. The counting and the ending live in ``formats/mds_costing.py``, shared with the local
writer ``preprocess`` uses without importing streaming (``formats/mds_local.py``). Leaving the ``with`` block by an exception writes no index at all (the stock writer
would finish the dataset anyway), so an interrupted write stays detectably incomplete.
"""

from __future__ import annotations

from streaming import MDSWriter

from bcl_stream.formats.mds_costing import DEFAULT_COLUMNS, CostedMDS
from bcl_stream.io import streaming_compat

__all__ = ["DEFAULT_COLUMNS", "CostedMDSWriter"]


@streaming_compat.own_index_writing
class CostedMDSWriter(CostedMDS, MDSWriter):  # type: ignore[misc]
    """``MDSWriter`` that also records each record's token count and writes the cost index
    (:class:`~bcl_stream.formats.mds_costing.CostedMDS` says how); every column encoding,
    compression and remote output streaming supports."""

    def _close_shard_at(self, records: int | None) -> None:
        streaming_compat.close_shard_at(self, records)

    def _wait_for_uploads(self) -> bool:
        return streaming_compat.wait_for_shard_uploads(self)

    def _abandon_uploads(self) -> None:
        streaming_compat.abandon_shard_uploads(self)
