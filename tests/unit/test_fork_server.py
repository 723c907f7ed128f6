"""The fork server (``tools/fork_server.py``; its client, ``tools/fork_client.py``): a forked
run is what ``python -m MODULE ARGS`` would be (exit code, stdout, stderr, environment,
working directory, ``sys.argv``, ``__main__``; atexit handlers run), a crash or a hang of a
child is reported and never hangs the caller, the CPU of a child is reported (and charged to the job that asked for it), a
request whose start-up environment differs is refused, and a fresh-interpreter request never
forks. The servers here import only ``json`` (the behaviour does not depend on what is
preloaded; the suite's servers import torch, Lightning and streaming)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import fork_client, fork_server
from tools.fork_client import ForkServer, Refused

PROBE = """
import atexit, json, os, sys, tempfile, time
import __main__
args = sys.argv[1:]
if args[0] == "busy":
    end = time.process_time() + float(args[1])
    while time.process_time() < end:
        pass
elif args[0] == "kill":
    os.kill(os.getpid(), 9)
elif args[0] == "os_exit":
    os._exit(7)
elif args[0] == "segfault":
    import ctypes
    ctypes.string_at(0)
elif args[0] == "sleep":
    time.sleep(float(args[1]))
elif args[0] == "group":  # a grandchild that holds stdout too, then wait to be killed
    import subprocess
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                      "kid": kid.pid}), flush=True)
    time.sleep(600)
elif args[0] == "raise":
    raise ValueError("from the probe")
elif args[0] == "ask":  # run a busy child on the server named in the env, charged to a tag
    sys.path.insert(0, os.environ["CHECKOUT"])
    from tools import fork_client
    server = fork_client.ForkServer(os.environ["SERVER"])
    done = fork_client.run(server, "probe", ["busy", "0.5"], env=dict(os.environ),
                           cwd=os.getcwd(), timeout=60, charge_to="owner")
    print(done.returncode)
else:
    marker = args[1]
    atexit.register(lambda: open(marker, "w").write("atexit ran"))
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "probe_var": os.environ.get("PROBE_VAR"),
        "tmp": tempfile.gettempdir(), "name": __name__, "spec": getattr(__main__.__spec__, "name", None),
        "main_file": __main__.__file__, "path0": sys.path[0],
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(args[2]))
"""
ROOT = fork_server.ROOT


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("probe")
    (where / "probe.py").write_text(PROBE)
    return where


@pytest.fixture(scope="module")
def server(probe_dir: Path) -> Iterator[ForkServer]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(probe_dir)])}
    started = ForkServer.start(env, modules=["json"])
    yield started
    started.close()


def env_for(probe_dir: Path, tmp: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(probe_dir)]),
        "TMPDIR": str(tmp),
        "PROBE_VAR": "set here",
        **extra,
    }


def forked(
    server: ForkServer,
    env: dict[str, str],
    cwd: Path,
    *args: str,
    timeout: float = 60,
    target: str = "probe",
) -> subprocess.CompletedProcess[str]:
    return fork_client.run(server, target, list(args), env=env, cwd=cwd, timeout=timeout)


def fresh(
    env: dict[str, str], cwd: Path, *args: str, target: str = "probe"
) -> subprocess.CompletedProcess[str]:
    how = [target] if target.endswith(".py") else ["-m", target]
    return subprocess.run(
        [sys.executable, *how, *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("as_script", [False, True], ids=["python -m", "python SCRIPT"])
def test_a_forked_run_is_what_a_fresh_interpreter_gives(
    server: ForkServer, probe_dir: Path, tmp_path: Path, as_script: bool
) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = env_for(probe_dir, tmp_path)
    target = str(probe_dir / "probe.py") if as_script else "probe"
    runs = {}
    for kind in ("forked", "fresh"):
        marker = tmp_path / f"{kind}.atexit"
        args = ("report", str(marker), "3")
        if kind == "forked":
            proc = forked(server, env, cwd, *args, target=target)
        else:
            proc = fresh(env, cwd, *args, target=target)
        assert marker.read_text() == "atexit ran"  # the normal exit path: atexit handlers ran
        runs[kind] = (proc.returncode, json.loads(proc.stdout), proc.stderr)
        assert runs[kind][1]["argv"].pop(-2) == str(marker)
    assert runs["forked"] == runs["fresh"]
    code, seen, err = runs["forked"]
    assert code == 3 and err == "to stderr\n"
    assert seen["path0"] == (str(probe_dir) if as_script else str(cwd))
    assert seen["probe_var"] == "set here" and seen["tmp"] == str(tmp_path)
    assert seen["cwd"] == str(cwd) and seen["name"] == "__main__"
    assert seen["spec"] == (None if as_script else "probe")
    assert seen["argv"][0] == str(probe_dir / "probe.py") == seen["main_file"]


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(
    server: ForkServer, probe_dir: Path, tmp_path: Path
) -> None:
    proc = forked(server, env_for(probe_dir, tmp_path), tmp_path, "raise")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ValueError: from the probe" in proc.stderr


@pytest.mark.parametrize(
    ("how", "code"), [("kill", -signal.SIGKILL), ("segfault", -signal.SIGSEGV), ("os_exit", 7)]
)
def test_a_crashing_child_is_reported_not_hung_on(
    server: ForkServer, probe_dir: Path, tmp_path: Path, how: str, code: int
) -> None:
    proc = forked(server, env_for(probe_dir, tmp_path), tmp_path, how, timeout=60)
    assert proc.returncode == code


def test_a_timeout_kills_the_child(server: ForkServer, probe_dir: Path, tmp_path: Path) -> None:
    env = env_for(probe_dir, tmp_path)
    child = server.fork("probe", ["sleep", "600"], env=env, cwd=tmp_path, fds=[0, 1, 2])
    assert child.poll(0.5) is None  # still running
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked(server, env, tmp_path, "sleep", "600", timeout=1.0)
    assert time.monotonic() - started < 30
    child.kill()
    assert child.poll(30) == (-signal.SIGKILL, pytest.approx(0.0, abs=1.0))
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)  # reaped by the server: gone


def first_line(fd: int) -> dict[str, int]:
    got = b""
    while not got.endswith(b"\n"):
        chunk = os.read(fd, 1)
        assert chunk, got
        got += chunk
    return dict(json.loads(got))


@pytest.mark.parametrize("session", [False, True], ids=["plain", "session"])
def test_a_session_request_is_its_own_process_group_that_killpg_ends(
    server: ForkServer, probe_dir: Path, tmp_path: Path, session: bool
) -> None:
    """``session``: the child is the leader of a new session and process group, as
    ``start_new_session=True`` makes it, so ``os.killpg(child.pid)`` ends it and what it
    started (the pipe they shared then reads to its end); without it the child stays in the
    server's group."""
    read, write = os.pipe()
    try:
        child = server.fork(
            "probe", ["group"], env=env_for(probe_dir, tmp_path), cwd=tmp_path,
            fds=[0, write, write], session=session,
        )  # fmt: skip
    finally:
        os.close(write)
    proc = fork_client.ForkedPopen(child, read, ["probe", "group"])
    seen = first_line(read)
    assert seen["pid"] == proc.pid and proc.poll() is None
    if not session:
        assert seen["pgid"] == os.getpgid(server.proc.pid) != proc.pid  # type: ignore[union-attr]
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.5)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        os.kill(seen["kid"], signal.SIGKILL)
        child.kill()
        proc.communicate(timeout=30)
        return
    assert seen["pgid"] == seen["sid"] == proc.pid != os.getpgid(0)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # The pipe reads to its end only once the grandchild, which held it too, has exited.
    out, _ = proc.communicate(timeout=30)
    assert out == b"" and proc.returncode == proc.poll() == -signal.SIGKILL


def test_cpu_is_reported_and_charged_to_the_job_that_asked(
    server: ForkServer, probe_dir: Path, tmp_path: Path
) -> None:
    env = env_for(probe_dir, tmp_path)
    busy = server.fork("probe", ["busy", "0.5"], env=env, cwd=tmp_path, fds=[0, 1, 2])
    code, cpu = busy.poll(None)  # type: ignore[misc]
    assert code == 0 and cpu >= 0.5
    asking = {**env, "SERVER": server.address, "CHECKOUT": str(ROOT)}
    with open(tmp_path / "out", "w+b") as out:
        owner = server.fork(
            "probe", ["ask"], env=asking, cwd=tmp_path, fds=[0, out.fileno(), 2], owns="owner"
        )
        code, cpu = owner.poll(None)  # type: ignore[misc]
        out.seek(0)
        assert code == 0 and out.read() == b"0\n"
    assert cpu >= 0.5  # its own CPU and the busy run it asked the server for


def test_cpu_charged_to_a_job_of_another_server_is_reported_when_it_closes(
    probe_dir: Path, tmp_path: Path
) -> None:
    env = env_for(probe_dir, tmp_path)
    other = ForkServer.start(env, modules=["json"])
    busy = other.fork(
        "probe", ["busy", "0.5"], env=env, cwd=tmp_path, fds=[0, 1, 2], charge_to="elsewhere"
    )
    assert busy.poll(None) is not None
    other.close()
    assert other.unclaimed.keys() == {"elsewhere"} and other.unclaimed["elsewhere"] >= 0.5


def test_a_different_start_up_environment_is_refused(
    server: ForkServer, probe_dir: Path, tmp_path: Path
) -> None:
    for extra in ({"OMP_NUM_THREADS": "7"}, {"HF_HOME": str(tmp_path)}, {"PYTHONHASHSEED": "1"}):
        with pytest.raises(Refused, match=next(iter(extra))):
            forked(server, env_for(probe_dir, tmp_path, **extra), tmp_path, "busy", "0")
    shadow = tmp_path / "shadow"
    (shadow / "json").mkdir(parents=True)  # would shadow the json the server imported
    env = env_for(probe_dir, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env["PYTHONPATH"]])
    with pytest.raises(Refused, match="json"):
        forked(server, env, tmp_path, "busy", "0")


def test_a_fresh_request_never_forks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fresh=True`` and ``python_process`` start ``sys.executable`` as this process's child;
    the default is forked from a server, whose child is not ours."""
    from cli_process import python_process, run_module, start_module

    code = "import os; print(os.getppid())"
    (tmp_path / "ppid.py").write_text(code)
    ours = str(os.getpid())
    assert run_module("ppid", path=[tmp_path], fresh=True).stdout.strip() == ours
    assert python_process(code).stdout.strip() == ours
    assert run_module("ppid", path=[tmp_path]).stdout.strip() != ours
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}

    def started(**how: bool) -> str:
        out, _ = start_module("ppid", env=env, cwd=tmp_path, **how).communicate(timeout=60)
        return str(out.decode().strip())

    assert started(fresh=True) == ours and started(session=True) != ours
    monkeypatch.setenv(fork_server.FORK_ENV, "0")
    assert run_module("ppid", path=[tmp_path]).stdout.strip() == ours
    assert started(session=True) == ours
