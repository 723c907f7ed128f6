"""The client side of the fork server (``tools/fork_server.py``): start a server, ask it for a
child, wait for the child's end and its CPU; :func:`run_forked` is what ``tests/cli_process.py``
calls. Kept apart from the server, which is what runs in the pre-imported process."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tools.fork_server import (
    ENV_REFUSAL,
    FORK_ENV,
    HEADER,
    ROOT,
    SERVER_ENV,
    TAG_ENV,
    import_time_env,
    is_script,
)


class Refused(Exception):
    """The server cannot run this request as a fresh interpreter would (the reason)."""


class Forked:
    """A child of a fork server: its pid, and its end (wait status and CPU seconds)."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self._rest = b""
        self.result: tuple[int, float] | None = None

    def poll(self, timeout: float | None = 0.0) -> tuple[int, float] | None:
        """(exit code as ``subprocess`` gives it, CPU seconds), or None if still running after
        ``timeout`` seconds (None: wait for the end)."""
        if self.result is not None:
            return self.result
        self.conn.settimeout(timeout)
        try:
            while b"\n" not in self._rest:
                chunk = self.conn.recv(4096)
                if not chunk:
                    raise ConnectionError(f"fork server lost child {self.pid}")
                self._rest += chunk
        except (TimeoutError, BlockingIOError):
            return None
        message = json.loads(self._rest.split(b"\n", 1)[0])
        self.conn.close()
        self.result = os.waitstatus_to_exitcode(message["status"]), float(message["cpu"])
        return self.result

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """A running server (started here, or named by an address) and requests to it."""

    def __init__(self, address: str, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.address, self.proc = address, proc
        self.unclaimed: dict[str, float] = {}

    @classmethod
    def start(
        cls,
        env: Mapping[str, str],
        cwd: Path = ROOT,
        log: Path | None = None,
        modules: Sequence[str] = (),
    ) -> ForkServer:
        """Start ``python -m tools.fork_server`` in ``env`` and ``cwd`` and wait until it has
        imported ``modules`` (default :data:`PRELOAD`; its stderr into ``log``, else
        discarded)."""
        address = tempfile.mktemp(prefix="bcl-fork-", suffix=".sock", dir="/tmp")
        err = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tools.fork_server", address, *modules],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line != b"ready\n":
            proc.wait()
            raise RuntimeError(f"fork server did not start (exit {proc.returncode})")
        return cls(address, proc)

    def close(self) -> float:
        """Stop a server started here (it ends when its running children have); its CPU and
        that of its children. ``unclaimed`` is then the CPU of the runs charged to a job this
        server did not run (the runner's groups run on its first server, and their Lightning
        fits on the second), by tag."""
        if self.proc is None:
            return 0.0
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        last = self.proc.stdout.readline()
        self.unclaimed = {str(k): float(v) for k, v in json.loads(last or b"{}").items()}
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        return usage.ru_utime + usage.ru_stime

    def fork(
        self,
        module: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | str,
        fds: Sequence[int],
        owns: str | None = None,
        charge_to: str | None = None,
    ) -> Forked:
        """Start ``python -m module args`` as a child of the server, ``fds`` as its 0, 1 and 2;
        raises :class:`Refused` when its environment or path rule that out."""
        request = {
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": str(Path(cwd).resolve()),
            "owns": owns,
            "charge_to": charge_to,
        }
        payload = json.dumps(request).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.address)
        socket.send_fds(conn, [HEADER.pack(len(payload)) + payload], list(fds))
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise ConnectionError("fork server closed the connection")
            reply += chunk
        message = json.loads(reply)
        if "refused" in message:
            conn.close()
            raise Refused(message["refused"])
        return Forked(conn, int(message["pid"]))


def run(
    server: ForkServer,
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    timeout: float | None,
    charge_to: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, module, *args], capture_output=True, text=True)`` through
    ``server``: stdout and stderr as text, never raises on the exit code; on ``timeout`` the
    child is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does.
    Standard input is this process's. Raises :class:`Refused` (nothing started)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = server.fork(
            module, args, env=env, cwd=cwd, fds=[0, out.fileno(), err.fileno()],
            charge_to=charge_to,
        )  # fmt: skip
        cmd = [sys.executable, *([module] if is_script(module) else ["-m", module]), *args]
        deadline = None if timeout is None else time.monotonic() + timeout
        result = child.poll(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if result is None:
            child.kill()
            child.poll(None)
            out.seek(0)
            err.seek(0)
            raise subprocess.TimeoutExpired(cmd, timeout or 0.0, out.read(), err.read())
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        return subprocess.CompletedProcess(cmd, result[0], texts[0], texts[1])


_SERVERS: dict[str, ForkServer] = {}


def run_forked(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    timeout: float | None,
) -> subprocess.CompletedProcess[str] | None:
    """:func:`run` on the runner's server (``BCL_FORK_SERVER``, charged to this group) or,
    where it refuses ``env``'s start-up variables, on a server of those started by this
    process on first use (stopped, and waited for so that its CPU counts in this process's,
    when this process exits); None where forking is off (``BCL_TEST_FORK=0``) or no server can
    run it as a fresh interpreter would: then the caller starts one."""
    if os.environ.get(FORK_ENV) == "0":
        return None
    for shared in filter(None, os.environ.get(SERVER_ENV, "").split(os.pathsep)):
        try:
            server = ForkServer(shared)
            tag = os.environ.get(TAG_ENV)
            return run(server, module, args, env=env, cwd=cwd, timeout=timeout, charge_to=tag)
        except Refused as exc:
            if not str(exc).startswith(ENV_REFUSAL):
                return None  # its start-up environment matched: a server of ours would refuse too
    key = json.dumps(sorted(import_time_env(env).items()))
    if key not in _SERVERS:
        if not _SERVERS:
            atexit.register(_close_servers)
        start_env = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        start_env.pop(SERVER_ENV, None)
        _SERVERS[key] = ForkServer.start(start_env)
    try:
        return run(_SERVERS[key], module, args, env=env, cwd=cwd, timeout=timeout)
    except Refused:
        return None


def _close_servers() -> None:
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()
