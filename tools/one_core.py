"""Run one measurement in its own process on one core: what every planning benchmark does, so
that caches, memory peaks and thread pools of one row never leak into the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_on_one_core(script: str, args: list[str], code: Path) -> dict[str, Any]:
    """``python SCRIPT ARGS`` with ``code`` first on ``PYTHONPATH``, pinned to core 0 where
    ``taskset`` exists (Linux); the last line of its stdout, parsed as JSON."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, script, *args]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row
