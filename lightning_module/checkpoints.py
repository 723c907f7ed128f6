"""Checkpoint files on disk: which one to resume from after a crash.

A Lightning concern (``.ckpt`` files written by the trainer), so it lives at the edge, not in
the core's integrity checks.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path


def last_complete_checkpoint(
    directory: str | os.PathLike[str], pattern: str = "*.ckpt"
) -> Path | None:
    """The newest checkpoint in ``directory`` that was written completely (``None``: none).

    Why: a job killed while saving (SIGKILL, node loss) can leave the newest ``.ckpt`` cut
    short; loading it then fails deep inside torch's zip reader. Newest is by modification
    time; incomplete candidates are skipped, each named in a warning.

    Nothing is unpickled: a checkpoint is a zip archive (``torch.save``'s format since torch
    1.6) whose central directory is written last, so a file with a readable central directory,
    a ``data.pkl`` record whose bytes check against their CRC, and every member inside the file
    was written completely (:func:`check_structure`). Unpickling each candidate, as
    ``torch.load(weights_only=False)`` does, would run whatever code a file placed in the
    directory carries; ``weights_only=True`` would refuse Lightning's own checkpoints (they hold
    hyperparameters and callback states).
    """
    candidates = sorted(
        Path(directory).glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in candidates:
        problem = check_structure(path)
        if problem is None:
            return path
        warnings.warn(f"{path}: unreadable checkpoint skipped ({problem})", stacklevel=2)
    return None


def check_structure(path: Path) -> str | None:
    """What makes ``path`` an incomplete ``torch.save`` archive, or None if it is complete.

    Reads the zip central directory and the pickle record's bytes (its CRC is checked), never
    the tensor data and never through the unpickler: O(members), whatever the file's size.
    """
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            pickles = [m for m in members if m.filename.endswith("/data.pkl")]
            if len(pickles) != 1:
                return f"{len(pickles)} data.pkl records in the archive, expected 1"
            for member in members:
                if member.header_offset + member.compress_size > size:
                    return f"member {member.filename} runs past the end of the file"
            with archive.open(pickles[0]) as fh:  # zipfile checks the CRC at the end
                while fh.read(1 << 20):
                    pass
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
