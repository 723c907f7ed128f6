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


class SlowSave(pl.Callback):
    """While a checkpoint is being saved: write ``saving-<step>`` into ``marker_dir`` (rank 0),
    then sleep ``seconds``, so a test can SIGKILL the job inside ``trainer.save_checkpoint``
    (after the state is gathered, before the file is written and renamed into place)."""

    def __init__(self, marker_dir: str = "", seconds: float = 0.0) -> None:
        super().__init__()
        self.marker_dir = marker_dir
        self.seconds = seconds

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if self.marker_dir and trainer.global_rank == 0:
            from pathlib import Path

            marker = Path(self.marker_dir) / f"saving-{trainer.global_step}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("")
        time.sleep(self.seconds)
