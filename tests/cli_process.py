"""``bcl-stream`` as a user runs it: a real ``python -m bcl_stream.cli`` process on this
checkout's code (importable from every test: pytest puts ``tests/`` on the path for its
conftest).

A run is forked from a pre-imported server (``tools/fork_server.py``) unless the caller asks
for a fresh interpreter (``fresh=True``, and :func:`python_process` always): the child is a
real process with its own pid, standard streams, environment, working directory,
``sys.argv`` and ``__main__`` as ``python -m`` gives them, and its exit code, but it does not
import torch, Lightning and streaming again (about 7 s of CPU a run). A run whose start-up
environment (``OMP_*``, ``HF_*``, ``PYTHON*``, ...) differs from the server's gets a server of
its own, or a fresh interpreter. A test of what a fresh interpreter does (imports, start-up)
asks for one; a test that signals or kills its run starts it with :func:`start_module` (in a
new session where the signal is for the run's whole process group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.fork_client import ForkedPopen, popen_forked, run_forked  # noqa: E402


def bcl_stream_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``bcl-stream ARGS`` with ``env`` (default: this process's environment), this
    checkout first on ``PYTHONPATH``; stdout and stderr captured as text, never raises on the
    exit code. ``fresh``: in a new interpreter, never forked (module docstring)."""
    return run_module("bcl_stream.cli", *args, env=env, cwd=cwd, timeout=timeout, fresh=fresh)


def run_module(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    path: Sequence[Path] = (),
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` with ``env`` (default: this process's environment) and
    ``path``, then this checkout, first on ``PYTHONPATH``; output captured as text, never
    raises on the exit code (``subprocess.TimeoutExpired`` after ``timeout``, the run killed).
    Forked from a pre-imported server unless ``fresh`` (module docstring)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), env.get("PYTHONPATH", "")])
    if not fresh:
        forked = run_forked(module, args, env=env, cwd=cwd or ROOT, timeout=timeout)
        if forked is not None:
            return forked
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_script(
    script: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` with ``env`` as given (default: this process's environment) in
    ``cwd`` (default: this process's); output captured as text, never raises on the exit code
    (``subprocess.TimeoutExpired`` after ``timeout``, the run killed). Forked from a
    pre-imported server unless ``fresh`` (module docstring): for scripts that import torch,
    Lightning or streaming anyway."""
    env = dict(os.environ if env is None else env)
    where = cwd or Path.cwd()
    if not fresh:
        forked = run_forked(str(script), args, env=env, cwd=where, timeout=timeout)
        if forked is not None:
            return forked
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=where, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def start_module(
    module: str | Path,
    *args: str,
    env: Mapping[str, str],
    cwd: Path = ROOT,
    session: bool = False,
    stderr: bool = True,
    fresh: bool = False,
) -> ForkedPopen | subprocess.Popen[bytes]:
    """``subprocess.Popen([python, -m, MODULE, *ARGS], stdout=PIPE, stderr=STDOUT,
    start_new_session=session)`` in ``env`` as given and ``cwd``, not waited for: for a test
    that polls, signals or kills its run (``session``: with every process the run starts, as
    one process group). ``module`` a ``Path``: ``python SCRIPT``; ``stderr`` False:
    ``stderr=DEVNULL``. Forked from a pre-imported server unless ``fresh`` (module
    docstring); ``pid``, ``returncode``, ``stdout`` (bytes), ``poll()`` and
    ``communicate()`` either way."""
    target = str(module)
    if not fresh:
        forked = popen_forked(target, args, env=env, cwd=cwd, session=session, stderr=stderr)
        if forked is not None:
            return forked
    how = [target] if isinstance(module, Path) else ["-m", target]
    return subprocess.Popen(
        [sys.executable, *how, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL, start_new_session=session,
    )  # fmt: skip


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


_IN_ONE_PROCESS = """
import importlib, json, os, sys, time, traceback
module, function = sys.argv[3].split(":")
main = getattr(importlib.import_module(module), function)
results = []
for i, args in enumerate(json.loads(sys.argv[1])):
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    for fd, name in ((1, "out"), (2, "err")):
        path = os.path.join(sys.argv[2], f"{i}.{name}")
        path = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(path, fd)
        os.close(path)
    started = time.monotonic()
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
    results.append([code, time.monotonic() - started])
print(json.dumps(results))
"""


def bcl_stream_cli_runs(
    commands: Sequence[Sequence[str]],
    scratch: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> list[tuple[subprocess.CompletedProcess[str], float]]:
    """Run several ``bcl-stream ARGS`` one after the other in ONE ``python`` process: see
    :func:`runs_in_one_process`."""
    return runs_in_one_process("bcl_stream.cli:main", commands, scratch, env, timeout)


def runs_in_one_process(
    entry: str,
    commands: Sequence[Sequence[str]],
    scratch: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    path: Sequence[Path] = (),
) -> list[tuple[subprocess.CompletedProcess[str], float]]:
    """Call ``entry`` (``module:function``, a CLI's ``main(argv) -> exit code``) once per
    command, one after the other in ONE ``python`` process (``path``, then this checkout, first
    on ``PYTHONPATH``): each command's exit code (the function's, ``SystemExit``'s, or 1 after
    the traceback an uncaught exception prints), its own stdout and stderr (file descriptors 1
    and 2 sent to files in ``scratch``: warnings, logging and C-level writes included) and its
    seconds. One interpreter start (torch, streaming, Lightning: 7-10 s of CPU) for all: for
    commands that share an environment and do not depend on a fresh interpreter, such as
    failure paths that each build their own clients, or fits on one device. Not for two
    commands that read one local dataset through streaming: the first one's dataset stays
    registered until the process exits, and streaming refuses the second ("Reused local
    directory")."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-c", _IN_ONE_PROCESS, json.dumps([list(c) for c in commands])]
    proc = subprocess.run(
        [*argv, str(scratch), entry], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    runs = []
    for i, (command, (code, seconds)) in enumerate(zip(commands, results, strict=True)):
        out, err = (
            (scratch / f"{i}.{name}").read_text(errors="replace") for name in ("out", "err")
        )
        runs.append((subprocess.CompletedProcess([entry, *command], code, out, err), seconds))
    return runs
