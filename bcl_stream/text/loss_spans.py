"""A record's loss mask as stored: ``loss_spans``, the trained token positions as intervals.

Why spans and not a per-token mask: a conversation of a few thousand tokens trains a handful
of contiguous runs (the assistant turns), so ``[s0, e0, s1, e1, ...]`` (half-open intervals
into the record's ``input_ids``, uint32) is a few dozen bytes where a byte mask is one byte
per token, and a reader never re-renders a template to know what is trained.

The stored form (MDS column ``loss_spans`` of type ``ndarray:uint32``; WebDataset member
``<key>.loss_spans.npy``): a flat uint32 array of even length, intervals sorted, not
overlapping, not empty, within ``[0, len(input_ids)]``. Touching intervals (``e_i == s_{i+1}``)
are allowed, so a mask can be written turn by turn; :func:`spans_from_mask` writes the
canonical (merged) form. A record without ``loss_spans`` trains every token.

The **trained-token count** (what a per-token mean divides by, stored per record in the cost
index as ``trained``) counts mask positions t >= 1: position 0 is never a target, nothing
precedes it. Without a mask it is ``max(L - 1, 0)``, what the collate trains without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError

LOSS_SPANS = "loss_spans"
"""The column (MDS) / member stem (WebDataset ``<key>.loss_spans.npy``) holding the spans."""
LOSS_SPANS_COLUMN = {LOSS_SPANS: "ndarray:uint32"}
"""The MDS column declaration of the spans."""


class LossSpansError(ValueError):
    """Spans that break the stored form (odd length, unsorted, overlapping, empty, too long)."""


def check_spans(value: Any, n_tokens: int) -> npt.NDArray[np.uint32]:
    """``value`` as stored spans (a flat uint32 array), or :class:`LossSpansError` saying which
    rule it breaks (the caller names the file and record)."""
    arr = np.asarray(value)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise LossSpansError(
            f"loss_spans must be a flat integer array [s0, e0, s1, e1, ...], got dtype "
            f"{arr.dtype} shape {arr.shape}"
        )
    if arr.size % 2:
        raise LossSpansError(f"loss_spans has odd length {arr.size}: it holds (start, end) pairs")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > n_tokens):
        raise LossSpansError(
            f"loss_spans reaches [{int(arr.min())}, {int(arr.max())}], outside the record's "
            f"{n_tokens} tokens"
        )
    pairs = arr.astype(np.int64).reshape(-1, 2)
    if (pairs[:, 1] <= pairs[:, 0]).any():
        i = int(np.flatnonzero(pairs[:, 1] <= pairs[:, 0])[0])
        raise LossSpansError(f"loss_spans interval {i} [{pairs[i, 0]}, {pairs[i, 1]}) is empty")
    if pairs.shape[0] > 1 and (pairs[1:, 0] < pairs[:-1, 1]).any():
        i = int(np.flatnonzero(pairs[1:, 0] < pairs[:-1, 1])[0])
        raise LossSpansError(
            f"loss_spans intervals {i} and {i + 1} overlap or are unsorted "
            f"([{pairs[i, 0]}, {pairs[i, 1]}) then [{pairs[i + 1, 0]}, {pairs[i + 1, 1]}))"
        )
    return arr.astype(np.uint32, copy=False)


def trained_count(spans: npt.ArrayLike | None, n_tokens: int) -> int:
    """Trained tokens of a record: mask positions t >= 1 (``max(L - 1, 0)`` without spans)."""
    if spans is None:
        return max(int(n_tokens) - 1, 0)
    pairs = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    return int(np.clip(pairs[:, 1] - np.maximum(pairs[:, 0], 1), 0, None).sum())


def spans_from_mask(mask: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """Canonical spans (merged runs) of a per-token 0/1 mask."""
    m = np.asarray(mask, dtype=bool).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m, [0]])))
    return edges.astype(np.uint32)


def mask_from_spans(spans: npt.ArrayLike, n_tokens: int) -> npt.NDArray[np.bool_]:
    """The per-token boolean mask of ``spans`` over a record of ``n_tokens`` tokens."""
    mask = np.zeros(n_tokens, dtype=bool)
    for start, end in np.asarray(spans, dtype=np.int64).reshape(-1, 2).tolist():
        mask[start:end] = True
    return mask


def full_spans(n_tokens: int) -> npt.NDArray[np.uint32]:
    """The spans of a record that trains every token (``[0, L]``; empty for L = 0): what a
    dataset with the column stores for a record given without a mask (same trained count)."""
    return np.asarray([0, n_tokens] if n_tokens else [], dtype=np.uint32)


def check_record_spans(record: Mapping[str, Any], want_trained: int, where: str) -> None:
    """Refuse a read record whose ``loss_spans`` break the stored form or train another count
    than the cost index's ``trained`` (the readers' check: a plan's loss denominators come
    from the index, so they must be what the collate trains). No spans: nothing to check."""
    spans = record.get(LOSS_SPANS)
    if spans is None or "input_ids" not in record:
        return
    n = len(record["input_ids"])
    try:
        checked = check_spans(spans, n)
    except LossSpansError as exc:
        raise DatasetError(f"{where}: {exc}; rewrite the record's mask (preprocess)") from exc
    got = trained_count(checked, n)
    if got != want_trained:
        raise DatasetError(
            f"{where}: its loss_spans train {got} tokens but the cost index says "
            f"{want_trained}: the shards and bcl_index.json do not belong together. Rebuild "
            "the cost index with `bcl-stream annotate --overwrite`."
        )
