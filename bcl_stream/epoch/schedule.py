"""The one interface a reader walks, whatever made the plan.

A reader yields rank r's micro-batches from a start on; what it needs of a plan is the same for
the lazy training plan (:class:`~bcl_stream.epoch.plan.ReaderPlan`, every contract: ``pack``,
``step``'s planned packs, ``tokens``' micro-batches padded with -1), the canonical plan as one
physical layout walks it (:class:`~bcl_stream.epoch.canonical.CanonicalPlan`) and the
evaluation plan (:class:`~bcl_stream.epoch.eval_plan.EvalPlan`). :class:`Schedule` names that
interface, so the reader depends on it alone (``formats/reader_base.py``: one walk, whatever
the contract) and a new kind of plan is one class that satisfies it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


@runtime_checkable
class Schedule(Protocol):
    """One epoch's micro-batches as a reader walks them."""

    @property
    def n_packs(self) -> int:
        """Micro-batches per rank, identical on every rank."""
        ...

    def iter_rank_packs(
        self, rank: int, start: int = 0, group: bool = False
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(index of the first micro-batch, micro-batches (n, width)) of ``rank`` from
        ``start`` on, in batches; rows padded with -1 past a micro-batch's records where
        their sizes vary. ``group``: the micro-batches of every rank of its planning row,
        (row_ranks, n, width), for a reader that sees each step whole (the ``step``
        contract's re-cut, each step's trained tokens); a plan that is walked rank by rank
        only (canonical, evaluation) refuses it."""
        ...

    def remainder_counts(self) -> dict[str, int]:
        """Records of the epoch no rank yields, by reason (the same on every rank)."""
        ...
