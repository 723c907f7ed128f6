"""Which positions of a record are trained: its stored ``loss_spans``, as a boolean mask.

Why a mask per position: both label conventions (``collate.py``) and the trained-token counts
a per-token mean divides by follow from one rule, so they cannot disagree. A record's
``loss_spans`` (``ndarray:uint32`` in MDS, ``<key>.loss_spans.npy`` in WebDataset) is the
flattened list of half-open intervals ``[s0, e0, s1, e1, ...]`` into its ``input_ids``:
sorted, non-overlapping, non-empty; the tokens inside them are targets. A record without the
key trains every token. Position 0 is never a target (nothing precedes it), so a record of
L tokens trains at most L - 1 and the trained count of one without a mask is max(L - 1, 0):
the count ``CostIndex.trained`` stores per record.

Truncation (``max_seq_len``) keeps the mask of the tokens kept: a target past the cut is not
trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError

SPANS_KEY = "loss_spans"
"""The record key (and stored column) holding the loss spans."""


def target_mask(record: Mapping[str, Any], length: int, sample_id: int) -> npt.NDArray[np.bool_]:
    """(length,) bool: True where position t is trained (t >= 1 and inside a span).

    ``length`` is the record's full token count (before truncation): spans are checked
    against it. A malformed mask is a :class:`DatasetError` naming the record and the fix."""
    mask = np.zeros(length, dtype=np.bool_)
    spans = record.get(SPANS_KEY)
    if spans is None:
        mask[1:] = True
        return mask
    arr = np.asarray(spans)
    problem = _span_problem(arr, length)
    if problem is not None:
        raise DatasetError(
            f"sample {sample_id}: loss_spans {problem}; loss_spans must be sorted, "
            f"non-overlapping, non-empty [start, end) pairs within the record's {length} tokens. "
            "Re-run preprocessing (or annotate) on this dataset"
        )
    for start, end in arr.reshape(-1, 2).tolist():
        mask[start:end] = True
    mask[:1] = False
    return mask


def _span_problem(arr: npt.NDArray[Any], length: int) -> str | None:
    """What is wrong with a flattened span list (None: nothing)."""
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        return f"must be a 1-D integer array, got {arr.dtype} {arr.shape}"
    if arr.size % 2:
        return f"has an odd number of values ({arr.size})"
    if arr.size == 0:
        return None
    flat = arr.astype(np.int64)
    if flat.min() < 0 or flat.max() > length:
        return f"reach past the record ({flat.min()}..{flat.max()})"
    pairs = flat.reshape(-1, 2)
    if (pairs[:, 1] <= pairs[:, 0]).any():
        return "hold an empty or reversed interval"
    if (pairs[1:, 0] < pairs[:-1, 1]).any():
        return "are unsorted or overlap"
    return None
