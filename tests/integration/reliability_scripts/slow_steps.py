"""A callback that sleeps after each training batch, so a test can SIGKILL a run mid-epoch.

A tiny model on a tiny dataset finishes an epoch in well under a second; the crash test needs
time to observe a step in the pack log and kill the job before it ends.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl


class SlowSteps(pl.Callback):
    """Sleep ``seconds`` at the end of every training batch."""

    def __init__(self, seconds: float = 0.05) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)
