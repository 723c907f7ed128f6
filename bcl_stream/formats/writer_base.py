"""What the costed MDS and WebDataset writers share: the ending and the context manager.

Both writers collect one token count and one trained-token count per record (``array('I')``:
4 bytes per record each, not a Python int) and end the same way: build the cost index, write it beside the shards,
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
from bcl_stream.text.loss_spans import LOSS_SPANS, LossSpansError, check_spans, trained_count


def seal_cost_index(
    tokens: array[int],
    cost_model: CostModel,
    shards: Sequence[ShardEntry],
    format: str,
    extra: dict[str, Any],
    local: str | os.PathLike[str],
    remote: str | None,
    hashes: array[int] | None = None,
    trained: array[int] | None = None,
) -> CostIndex:
    """Build the index from the collected counts (per-record hashes, an ``array('Q')``, and
    trained-token counts, an ``array('I')``), write it locally, upload it if remote (the JSON
    last).

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
        None if trained is None else np.frombuffer(trained, dtype=np.uint32).copy(),
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


def record_trained(
    sample: dict[str, Any], tokens: int, trained: int | None, record: int
) -> tuple[Any, int]:
    """(the record's checked ``loss_spans`` or None, its trained-token count): ``trained`` as
    given, else counted from ``sample["loss_spans"]``, else ``max(tokens - 1, 0)``. A count
    given beside spans must agree with them; spans that break the stored form are refused
    naming the record (:mod:`bcl_stream.text.loss_spans`)."""
    spans = sample.get(LOSS_SPANS)
    if spans is not None:
        try:
            spans = check_spans(spans, tokens)
        except LossSpansError as exc:
            raise ValueError(f"record {record}: {exc}") from exc
        counted = trained_count(spans, tokens)
        if trained is not None and trained != counted:
            raise ValueError(
                f"record {record}: trained={trained} given, but its loss_spans train {counted}"
            )
        return spans, counted
    if trained is None:
        return None, trained_count(None, tokens)
    if not 0 <= trained <= max(tokens - 1, 0):
        raise ValueError(
            f"record {record}: trained={trained} outside [0, {max(tokens - 1, 0)}] for "
            f"{tokens} tokens (position 0 is never a target)"
        )
    return None, trained
