"""A Lightning Trainer for tests, with what every test's Trainer leaves out said once.

Kept free of pytest so subprocess scripts can import it."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

QUIET: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
"""One CPU device; no logger, checkpoints, progress bar or model summary: a test's fit writes
and prints nothing it did not ask for. The YAML fits of
``tests/integration/lightning_scripts/harness.py`` start from it too."""


def cpu_trainer(**options: Any) -> pl.Trainer:
    """A :data:`QUIET` Trainer without sanity validation; ``options`` add to it or override it
    (``max_steps``, ``callbacks``, ``devices``, ``strategy``, ``default_root_dir``, ...)."""
    return pl.Trainer(**(QUIET | {"num_sanity_val_steps": 0} | options))
