"""``bcl-stream`` as a user runs it: a real ``python -m bcl_stream.cli`` process on this
checkout's code (importable from every test: pytest puts ``tests/`` on the path for its
conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bcl_stream_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``bcl-stream ARGS`` with ``env`` (default: this process's environment), this
    checkout first on ``PYTHONPATH``; stdout and stderr captured as text, never raises on the
    exit code."""
    return run_module("bcl_stream.cli", *args, env=env, cwd=cwd, timeout=timeout)


def run_module(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    path: Sequence[Path] = (),
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` with ``env`` (default: this process's environment) and
    ``path``, then this checkout, first on ``PYTHONPATH``; output captured as text, never
    raises on the exit code."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def python_process(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` in a bare environment (this checkout on ``PYTHONPATH``, a minimal
    ``PATH``): what a fresh shell imports, nothing inherited from the test process."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
