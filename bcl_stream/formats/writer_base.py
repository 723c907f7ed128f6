"""What the costed MDS and WebDataset writers share: the ending and the context manager.

Both writers collect one token count per record (an ``array('I')``: 4 bytes per record, not
a Python int each) and end the same way: build the cost index, write it beside the shards,
and upload ``bcl_costs.npy`` then ``bcl_index.json`` before the format's own completion
marker, because readers take the marker as "dataset complete".
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np

from bcl_stream.cost import CostModel
from bcl_stream.io.index import CostIndex, ShardEntry, write_index
from bcl_stream.io.remote import upload_index


def seal_cost_index(
    tokens: array[int],
    cost_model: CostModel,
    shards: Sequence[ShardEntry],
    format: str,
    extra: dict[str, Any],
    local: str | os.PathLike[str],
    remote: str | None,
    hashes: array[int] | None = None,
) -> CostIndex:
    """Build the index from the collected counts (and per-record hashes, an ``array('Q')``),
    write it locally, upload it if remote (the JSON last).

    A preprocessing report in ``extra`` gets its ``shards`` count here: the pipeline stores the
    report before the last shard closes, so only the sealed shard list knows the number.
    """
    report = extra.get("preprocess")
    if isinstance(report, dict) and "shards" in report:
        extra = {**extra, "preprocess": {**report, "shards": len(shards)}}
    index = CostIndex.build(
        np.frombuffer(tokens, dtype=np.uint32).copy(),
        cost_model,
        tuple(shards),
        format,
        extra,
        None if hashes is None else np.frombuffer(hashes, dtype=np.uint64).copy(),
    )
    write_index(local, index)
    if remote:
        upload_index(local, remote)
    return index


class FinishOnExit:
    """``with Writer(...) as w:`` finishes on success and aborts (no index) on an exception,
    so an interrupted write never looks complete. The class using it provides ``finish()``
    and ``abort()`` (no stubs here: they would shadow ``MDSWriter.finish`` in the MRO)."""

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        writer: Any = self
        if exc_type is None:
            writer.finish()
        else:
            writer.abort()
