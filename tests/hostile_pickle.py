"""A pickle that runs code when it is loaded: the proof, in the checkpoint tests, that a
loader or a probe unpickled a file it should have refused (the marker directory appears)."""

from __future__ import annotations

import os
from pathlib import Path


class RunsCode:
    """Unpickling this creates the directory ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)
