"""Checkpoint files on disk: which one to resume from after a crash.

A Lightning concern (``.ckpt`` files written by the trainer), so it lives at the edge, not in
the core's integrity checks.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch


def last_complete_checkpoint(
    directory: str | os.PathLike[str], pattern: str = "*.ckpt"
) -> Path | None:
    """The newest checkpoint in ``directory`` that loads (``None`` if there is none).

    Why: a job killed while saving (SIGKILL, node loss) can leave the newest ``.ckpt`` cut
    short; ``torch.load`` then fails deep inside its zip reader. Newest is by modification
    time; each candidate is opened with ``torch.load(mmap=True)`` (no tensor data is read) and
    the unreadable ones are skipped, each named in a warning.
    """
    candidates = sorted(
        Path(directory).glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in candidates:
        try:
            torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except Exception as exc:  # torch's zip reader raises RuntimeError, EOFError, ...
            warnings.warn(
                f"{path}: unreadable checkpoint skipped ({type(exc).__name__}: {exc})",
                stacklevel=2,
            )
            continue
        return path
    return None
