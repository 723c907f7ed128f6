"""The outlier policy: what to do with a record longer than ``--max-record-tokens``.

``error`` (default) stops at the first one and names it; ``truncate`` keeps the first
``max_record_tokens`` ids; ``drop`` leaves the record out. A record with a loss mask that
truncation leaves with nothing to train (its response lies past the cut) is left out too, and
counted apart (``dropped_untrained``): it would cost compute and train nothing. Whatever
happens is counted and stored in the cost index (``extra.preprocess.outliers``): a record is
never lost silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError

POLICIES = ("error", "truncate", "drop")


@dataclass(slots=True)
class OutlierPolicy:
    """Applies the policy and counts what it did."""

    max_record_tokens: int | None = None
    policy: str = "error"
    truncated: int = 0
    dropped: int = 0
    tokens_removed: int = 0
    dropped_untrained: int = 0
    """Masked records truncation left with no trained token (left out, not truncated)."""
    longest_seen: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--outliers must be one of {POLICIES}, got {self.policy!r}")
        if self.max_record_tokens is not None and self.max_record_tokens < 1:
            raise ValueError(f"--max-record-tokens must be >= 1, got {self.max_record_tokens}")

    def apply(self, source: str, ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32] | None:
        """The ids to write (maybe truncated), or None when the record is dropped."""
        n = int(ids.size)
        self.longest_seen = max(self.longest_seen, n)
        cap = self.max_record_tokens
        if cap is None or n <= cap:
            return ids
        if self.policy == "error":
            raise DatasetError(
                f"{source}: record has {n} tokens, above --max-record-tokens {cap}. "
                "Pass --outliers truncate or --outliers drop, or raise the cap."
            )
        self.tokens_removed += n - cap if self.policy == "truncate" else n
        if self.policy == "truncate":
            self.truncated += 1
            return ids[:cap]
        self.dropped += 1
        return None

    def drop_untrained(self, kept: int) -> None:
        """A record :meth:`apply` truncated to ``kept`` ids trains nothing: leave it out."""
        self.truncated -= 1
        self.dropped_untrained += 1
        self.tokens_removed += kept

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
