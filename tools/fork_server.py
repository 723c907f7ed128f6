"""A pre-imported fork server: ``python -m MODULE ARGS`` without paying the imports again.

A process that imports torch, Lightning, transformers and streaming spends about 8 s of CPU
before its first line of work, and the test suite starts hundreds of such processes: one pytest
process per test group (``tools/run_tests.py``), CLI runs and ``python -m lightning_module``
fits started by the tests (``tests/cli_process.py``). The server imports those modules ONCE and
then forks one child per request; the child takes the requested standard streams (file
descriptors passed over a Unix socket), environment, working directory and ``sys.argv``, and
runs the module as ``python -m`` does (``runpy``'s ``_run_module_as_main``: ``__main__`` and
``__spec__`` as a fresh interpreter has them, so Lightning's ``ddp`` launcher re-runs the right
command line for its other ranks). The child ends through the interpreter's normal exit:
``SystemExit``'s code, 1 after the traceback of an uncaught exception, and its ``atexit``
handlers run (streaming frees its shared memory there).

Why the child is as good as a fresh process for these runs:
- Each child is its own process with a real pid; nothing of a child survives into the next
  one. The server imports modules and does nothing else: it builds no dataset, runs no torch
  op, starts no Python thread (:func:`preload` checks ``threading.enumerate()``: the one native
  thread numpy's OpenBLAS starts for its pool is re-made by OpenBLAS's own fork handlers, as
  in every DataLoader worker), so streaming's registrations and shared memory are created in
  the child only.
- Start-up environment: what a module reads from the environment while it is imported
  (:data:`IMPORT_TIME` prefixes: ``PYTHON*``, ``HF_*``, ``TRANSFORMERS_*``, ``TORCH*``,
  ``OMP_*``, locale, home and cache directories, ...) was read by the server. A request whose
  environment differs from the server's in one of them is refused, and the caller starts a
  fresh interpreter (or a server of that environment). ``TMPDIR`` is read lazily: the child
  resets ``tempfile.tempdir`` (which importing streaming fills in), and streaming calls
  ``gettempdir()`` each time it looks for a prefix. ``PYTHONPATH`` and the working directory
  may differ when no module the server imported would be found elsewhere under the request's
  path (:func:`path_conflict`).
- CPU accounting: the server ``wait4``s every child and sends its rusage (its own and that of
  every descendant it waited for) to whoever asked. A request may name the job it is charged
  to (``charge_to``), so the runner still prints each group's CPU with the CLI runs its tests
  asked for; the server's own CPU and its children's count in the run's total once the server
  is waited for.

Not for a run that checks what a fresh interpreter does (imports, start-up time, a bare
environment): those callers start ``sys.executable``. A request may ask for a new session
(``session``: the child calls ``setsid()`` first, as ``subprocess.Popen(...,
start_new_session=True)`` does), so that a caller can signal the child and every process it
starts as one process group (the kill-and-resume tests SIGKILL a whole DDP job that way).

Protocol: one Unix-socket connection per job. The client sends a length-prefixed JSON request
(module, args, env, cwd, optional ``owns`` / ``charge_to`` tags and ``session``) with three
descriptors for the child's fds 0, 1 and 2; the server answers one JSON line ``{"pid": N}`` or ``{"refused":
WHY}``, and when the child has ended, ``{"status": WAIT_STATUS, "cpu": SECONDS}``. The server
runs until its standard input (a pipe from the process that started it) closes, then waits for
its running children and exits.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import tempfile
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PRELOAD = (
    "numpy",
    "torch",
    "pytest",
    "streaming",
    "webdataset",
    "transformers",
    "lightning.pytorch",
    "bcl_stream",
    "bcl_stream.cli",
    "lightning_module",
    "lightning_module.__main__",
)
"""What a server imports before its first fork: the heavy modules every test process and CLI
run imports (7-10 s of CPU together) and nothing that starts work."""
IMPORT_TIME = (
    "PYTHON",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "CUDA_",
    "NCCL_",
    "TRITON_",
    "LD_",
    "MALLOC_",
    "XDG_",
    "HOME",
    "LANG",
    "LC_",
    "PL_",
    "LIGHTNING_",
    "WDS_",
    "GOPEN_",
    "NUMBA_",
)
"""Prefixes of environment variables a module may read while it is imported (or Python at
start-up). A request that differs from the server in one of them is refused. ``PYTHONPATH``
is checked apart (:func:`path_conflict`)."""
HEADER = struct.Struct("!I")
FORK_ENV = "BCL_TEST_FORK"
"""``BCL_TEST_FORK=0``: the runner and the tests' helpers start fresh interpreters only (to
compare, or to rule the server out)."""
SERVER_ENV = "BCL_FORK_SERVER"
"""Set by the runner in each group: the addresses of its servers (``os.pathsep`` between
them), which the group's tests use for their runs too (one import for the whole suite)."""
TAG_ENV = "BCL_FORK_TAG"
"""Set by the runner in each group: the group's tag, which runs asked for by its tests are
charged to (the runner prints a group's CPU with its runs')."""


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that :data:`IMPORT_TIME` names, ``PYTHONPATH`` aside."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONPATH"}


def is_script(target: str) -> bool:
    """A request's target is a script's path (``python SCRIPT``), not a module (``-m``)."""
    return target.endswith(".py")


def first_dir(target: str, cwd: str) -> str:
    """What Python puts first on ``sys.path``: the script's directory, or for ``-m`` the
    working directory."""
    return str(Path(cwd, target).resolve().parent) if is_script(target) else cwd


def front_path(cwd: str, pythonpath: str) -> list[str]:
    """The directories ``python -m`` puts before the standard ones: the working directory, then
    ``PYTHONPATH``'s entries (absolute, first occurrence kept)."""
    out: list[str] = []
    for entry in [cwd, *pythonpath.split(os.pathsep)]:
        if entry:
            entry = os.path.abspath(os.path.join(cwd, entry))
            if entry not in out:
                out.append(entry)
    return out


def path_conflict(server_front: Sequence[str], front: Sequence[str]) -> str | None:
    """Why a child with ``front`` first on ``sys.path`` could import a module the server
    imported from somewhere else, or None: a directory only the request has that holds a
    top-level module the server imported, or one only the server has that it imported from."""
    loaded = {name for name in sys.modules if "." not in name}
    for entry in front:
        if entry in server_front or not os.path.isdir(entry):
            continue
        names = {Path(n).name.split(".")[0] for n in os.listdir(entry)}
        clash = sorted(names & loaded)
        if clash:
            return f"{entry} holds {clash[0]}, imported by the server from elsewhere"
    for entry in server_front:
        if entry in front:
            continue
        for name in loaded:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if origin.startswith(entry + os.sep):
                return f"the server imported {name} from {entry}, which the request lacks"
    return None


ENV_REFUSAL = "start-up environment differs in"
"""How a refusal over the start-up environment begins: a server of the request's environment
could run it. Any other refusal (the path) a new server would make too."""


def refusal(
    server_env: Mapping[str, str],
    server_cwd: str,
    request: Mapping[str, Any],
    set_by_imports: Sequence[str] = (),
) -> str:
    """Why the server cannot run ``request`` as a fresh interpreter would, or ''. Variables
    the server's imports set (``set_by_imports``: torch's inductor cache directory, Lightning's
    NVML switch) are not compared: a request made from a process that did the same imports
    carries them, and the imports keep a value already set or set the same one."""
    env = {k: v for k, v in request["env"].items() if k not in set_by_imports}
    ours, theirs = import_time_env(server_env), import_time_env(env)
    if ours != theirs:
        keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        return f"{ENV_REFUSAL} {', '.join(keys)}"
    conflict = path_conflict(
        front_path(server_cwd, server_env.get("PYTHONPATH", "")),
        front_path(first_dir(request["module"], request["cwd"]), env.get("PYTHONPATH", "")),
    )
    return conflict or ""


def preload(modules: Sequence[str] = PRELOAD) -> None:
    """Import ``modules``; refuse to serve if that started a Python thread (a thread does not
    survive a fork, and what it holds would stay locked in every child)."""
    for name in modules:
        importlib.import_module(name)
    import threading

    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if extra:
        raise SystemExit(f"fork server: importing {modules} started threads {extra}")


@dataclass
class Job:
    """What a forked child runs: ``python -m module args`` with this env and cwd on fds."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]
    session: bool = False
    """Start a new session (its own process group), as ``start_new_session=True``."""

    def run(self, server: Started) -> None:
        """Become the requested process, then run the module as ``python -m`` does; returns
        (exit 0) or raises like the module does, to the interpreter's own exit path."""
        if self.session:
            os.setsid()
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
        for fd in set(self.fds):
            if fd > 2:
                os.close(fd)
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        tempfile.tempdir = None  # filled in by importing streaming; read TMPDIR again
        tmp = tempfile.gettempdir()
        for key, value in server.added.items():  # as the imports would set them here
            if key not in self.env:
                if value.startswith(server.tmp + os.sep):
                    value = tmp + value[len(server.tmp) :]
                os.environ[key] = value
        for name in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(name, signal.SIG_DFL)
        front = front_path(first_dir(self.module, self.cwd), self.env.get("PYTHONPATH", ""))
        sys.path[:] = front + [p for p in sys.path if p and p not in server.front]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        if is_script(self.module):  # ``python SCRIPT ARGS``: run in ``__main__`` as Python does
            sys.argv[:] = [self.module, *self.args]
            main.__file__ = self.module
            main.__builtins__ = builtins
            main.__spec__ = None
            code = compile(Path(self.module).read_bytes(), self.module, "exec")
            exec(code, main.__dict__)
            return
        sys.argv[:] = ["-m", *self.args]
        for name in (self.module, f"{self.module}.__main__"):
            sys.modules.pop(name, None)  # a fresh interpreter has not imported it either
        runpy._run_module_as_main(self.module, alter_argv=True)  # type: ignore[attr-defined]


@dataclass
class _Conn:
    sock: socket.socket
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)


@dataclass
class _Running:
    conn: socket.socket
    owns: str | None
    charge_to: str | None


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client gave up (its timeout): still reaped
        sock.sendall(json.dumps(message).encode() + b"\n")


@dataclass
class Started:
    """The server's start: its environment before the imports (what requests are compared
    with), the variables the imports set (torch and Lightning set a few; a child gets them as
    its own imports would have set them, below its own temp dir where they were below the
    server's), its temp dir and the directories first on its path."""

    env: dict[str, str]
    added: dict[str, str]
    tmp: str
    front: list[str]


def serve(address: str, started: Started) -> Job | None:
    """Serve fork requests on the Unix socket ``address`` until standard input closes; returns
    None in the server when it is done, and the :class:`Job` in each forked child."""
    server_env, server_cwd = started.env, os.getcwd()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listen")
    sel.register(0, selectors.EVENT_READ, "stdin")
    conns: dict[socket.socket, _Conn] = {}
    running: dict[int, _Running] = {}
    charged: dict[str, float] = {}
    closing = False
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while not (closing and not running):
        for key, _ in sel.select(0.05):
            if key.data == "listen":
                sock, _ = listener.accept()
                sock.setblocking(True)
                conns[sock] = _Conn(sock)
                sel.register(sock, selectors.EVENT_READ, "conn")
            elif key.data == "stdin":
                if not os.read(0, 4096):
                    closing = True
                    sel.unregister(0)
                    sel.unregister(listener)
                    listener.close()
            else:
                conn = conns[key.fileobj]  # type: ignore[index]
                data, fds, _, _ = socket.recv_fds(conn.sock, 1 << 20, 3)
                conn.data += data
                conn.fds += fds
                size = HEADER.unpack_from(conn.data)[0] if len(conn.data) >= 4 else -1
                if not data or (size >= 0 and len(conn.data) >= 4 + size):
                    sel.unregister(conn.sock)
                    del conns[conn.sock]
                    request = json.loads(conn.data[4 : 4 + size]) if data else None
                    if request is None or len(conn.fds) != 3:
                        for fd in conn.fds:
                            os.close(fd)
                        conn.sock.close()
                        continue
                    why = refusal(server_env, server_cwd, request, list(started.added))
                    if why:
                        for fd in conn.fds:
                            os.close(fd)
                        _send(conn.sock, {"refused": why})
                        conn.sock.close()
                        continue
                    pid = os.fork()
                    if pid == 0:  # the child: drop everything of the server's
                        sel.close()
                        for other in [*conns.values()]:
                            for fd in other.fds:
                                os.close(fd)
                            other.sock.close()
                        for job in running.values():
                            job.conn.close()
                        conn.sock.close()
                        if not closing:
                            listener.close()
                        return Job(
                            request["module"],
                            list(request["args"]),
                            dict(request["env"]),
                            request["cwd"],
                            conn.fds,
                            bool(request.get("session")),
                        )
                    for fd in conn.fds:
                        os.close(fd)
                    running[pid] = _Running(
                        conn.sock, request.get("owns"), request.get("charge_to")
                    )
                    _send(conn.sock, {"pid": pid})
        while running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            job = running.pop(pid)
            cpu = usage.ru_utime + usage.ru_stime
            if job.charge_to is not None:
                charged[job.charge_to] = charged.get(job.charge_to, 0.0) + cpu
            if job.owns is not None:
                cpu += charged.pop(job.owns, 0.0)
            _send(job.conn, {"status": status, "cpu": cpu})
            job.conn.close()
    sys.stdout.write(json.dumps(charged) + "\n")  # charged to a job of another server's
    sys.stdout.flush()
    return None


def main(argv: Sequence[str]) -> None:
    """``python -m tools.fork_server SOCKET [MODULE ...]``: import ``MODULE``s (default
    :data:`PRELOAD`), then serve on ``SOCKET``."""
    modules = list(argv[1:]) or list(PRELOAD)
    before, tmp = dict(os.environ), tempfile.gettempdir()  # cached, as importing streaming does
    preload(modules)
    gc.collect()
    gc.freeze()  # a child's collections skip what the imports made: no copy of those pages
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}
    front = front_path(os.getcwd(), before.get("PYTHONPATH", ""))
    started = Started(before, added, tmp, front)
    job = serve(argv[0], started)
    if job is not None:
        job.run(started)


if __name__ == "__main__":
    main(sys.argv[1:])
