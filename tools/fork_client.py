"""The client side of the fork server (``tools/fork_server.py``): start a server, ask it for a
child, wait for the child's end and its CPU; :func:`run_forked` is what ``tests/cli_process.py``
calls. Kept apart from the server, which is what runs in the pre-imported process."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
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
        session: bool = False,
    ) -> Forked:
        """Start ``python -m module args`` as a child of the server, ``fds`` as its 0, 1 and 2
        (``session``: in a new session, its own process group); raises :class:`Refused` when
        its environment or path rule that out."""
        request = {
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": str(Path(cwd).resolve()),
            "owns": owns,
            "charge_to": charge_to,
            "session": session,
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
    for server, tag in _servers(env):
        try:
            return run(server, module, args, env=env, cwd=cwd, timeout=timeout, charge_to=tag)
        except Refused as exc:
            if not str(exc).startswith(ENV_REFUSAL):
                return None  # its start-up environment matched: a server of ours would refuse too
    return None


def _servers(env: Mapping[str, str]) -> Iterator[tuple[ForkServer, str | None]]:
    """The servers to ask, in turn, with the tag to charge a run to: the runner's
    (``BCL_FORK_SERVER``, this group's tag), then one of ``env``'s start-up environment
    started by this process on first use; none with ``BCL_TEST_FORK=0``."""
    if os.environ.get(FORK_ENV) == "0":
        return
    for shared in filter(None, os.environ.get(SERVER_ENV, "").split(os.pathsep)):
        yield ForkServer(shared), os.environ.get(TAG_ENV)
    key = json.dumps(sorted(import_time_env(env).items()))
    if key not in _SERVERS:
        if not _SERVERS:
            atexit.register(_close_servers)
        start_env = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        start_env.pop(SERVER_ENV, None)
        _SERVERS[key] = ForkServer.start(start_env)
    yield _SERVERS[key], None


class ForkedPopen:
    """What :func:`popen_forked` returns: the part of ``subprocess.Popen(...,
    stdout=PIPE, stderr=STDOUT)`` that a caller which polls, kills or waits for a run uses
    (``pid``, ``returncode``, ``stdout``, ``poll``, ``wait``, ``communicate``), for a child
    of a server."""

    def __init__(self, child: Forked, out: int, args: list[str]) -> None:
        self.child, self.pid, self.args = child, child.pid, args
        self.returncode: int | None = None
        # Unbuffered: what readline() did not ask for stays in the pipe for communicate().
        self.stdout = open(out, "rb", buffering=0)  # noqa: SIM115
        self._out, self._read = out, bytearray()

    def poll(self) -> int | None:
        """The exit code, or None while the run goes on."""
        return self._ended(0.0)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` if still running after ``timeout``."""
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _ended(self, timeout: float | None) -> int | None:
        """The exit code; None if still running after ``timeout`` seconds."""
        if self.returncode is None:
            result = self.child.poll(timeout)
            if result is not None:
                self.returncode = result[0]
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes, None]:
        """Everything the run wrote (stdout and stderr; read until every process that holds
        the pipe, descendants included, has closed it), then its end; as ``Popen``'s, raises
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the run left running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            if self._out >= 0:
                sel.register(self._out, selectors.EVENT_READ)
            while self._out >= 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0, bytes(self._read))
                if sel.select(left):
                    chunk = os.read(self._out, 1 << 16)
                    self._read += chunk
                    if not chunk:
                        sel.unregister(self._out)
                        self.stdout.close()
                        self._out = -1
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._ended(left) is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0, bytes(self._read))
        return bytes(self._read), None


def popen_forked(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    session: bool = False,
    stderr: bool = True,
) -> ForkedPopen | None:
    """``subprocess.Popen([python, -m, module, *args], stdout=PIPE, stderr=STDOUT,
    start_new_session=session)`` (``module`` a ``.py`` path: ``python SCRIPT``; ``stderr``
    False: ``stderr=DEVNULL``) through the servers :func:`run_forked` asks, without waiting
    for the end; None where none can run it as a fresh interpreter would (the caller then
    starts one). Its CPU is charged as :func:`run_forked`'s."""
    read, write = os.pipe()
    err = write if stderr else os.open(os.devnull, os.O_WRONLY)
    try:
        for server, tag in _servers(env):
            try:
                child = server.fork(
                    module, args, env=env, cwd=cwd, fds=[0, write, err], charge_to=tag,
                    session=session,
                )  # fmt: skip
            except Refused as exc:
                if not str(exc).startswith(ENV_REFUSAL):
                    break
                continue
            cmd = [sys.executable, *([module] if is_script(module) else ["-m", module]), *args]
            return ForkedPopen(child, read, cmd)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
        if err != write:
            os.close(err)
    os.close(read)
    return None


def _close_servers() -> None:
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()
