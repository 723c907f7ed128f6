"""Canonical ranks under Lightning: the accumulation the trainer must run, and its batch counter
after a resume on another data-parallel size (``bcl_stream/epoch/canonical.py``).

A physical rank of R runs the packs of V/R canonical ranks per optimizer step, so the trainer's
``accumulate_grad_batches`` must be G_c * V/R (G_c: ``plan.grad_accum``, a canonical rank's).
Lightning decides where an optimizer step ends from its own batch counter
(``batch_progress.current.ready % accumulate_grad_batches``), which a checkpoint restores in
the old size's micro-batches: a checkpoint after step s on 2 ranks with 2 micro-batches per
step says 2s, where 1 rank with 4 per step is at 4s. :func:`shift_progress` moves Lightning's
counters by the difference once, before the epoch loop starts, so its step boundaries and the
loader's fall on the same micro-batches. (The accumulation itself is checked by the core's
resolve step, ``bcl_stream/training/resolve.py``, for every trainer.)
"""

from __future__ import annotations

from typing import Any


def shift_progress(trainer: Any, shift: int) -> None:
    """Move the fit loop's batch counters (this epoch's and the totals) by ``shift``
    micro-batches: the loader resumed at the same optimizer step in this size's micro-batches."""
    if not shift:
        return
    progress = trainer.fit_loop.epoch_loop.batch_progress
    for tracker in (progress.current, progress.total):
        for name in ("ready", "started", "processed", "completed"):
            setattr(tracker, name, getattr(tracker, name) + shift)
