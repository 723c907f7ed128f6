"""Which positions of a record are trained: its stored ``loss_spans``, as a boolean mask.

Why a mask per position: both label conventions (``collate.py``) and the trained-token counts
a per-token mean divides by follow from one rule, so they cannot disagree. The stored form and
its checks are ``bcl_stream.text.loss_spans``'s; a record without ``loss_spans`` trains
every token. Position 0 is never a target (nothing precedes it), so a record of L tokens
trains at most L - 1: the count ``CostIndex.trained`` stores per record.

Truncation (``max_seq_len``) keeps the mask of the tokens kept: a target past the cut is not
trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError
from bcl_stream.text.loss_spans import LOSS_SPANS, LossSpansError, check_spans, mask_from_spans


def target_mask(record: Mapping[str, Any], length: int, sample_id: int) -> npt.NDArray[np.bool_]:
    """(length,) bool: True where position t is trained (t >= 1 and inside a span).

    ``length`` is the record's full token count (before truncation): spans are checked
    against it. A malformed mask is a :class:`DatasetError` naming the record and the fix."""
    spans = record.get(LOSS_SPANS)
    if spans is None:
        mask = np.ones(length, dtype=np.bool_)
    else:
        try:
            mask = mask_from_spans(check_spans(spans, length), length)
        except LossSpansError as exc:
            raise DatasetError(
                f"sample {sample_id}: {exc}; re-run preprocessing (or annotate) on this dataset"
            ) from exc
    mask[:1] = False
    return mask
