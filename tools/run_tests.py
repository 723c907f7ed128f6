"""Run the test suite: unit tests in one pytest process, each integration file in its own,
several processes at once, and one summary line at the end.

Why separate processes: Mosaic Streaming 0.13 keeps every shared-memory handle it opens
alive until interpreter exit (``atexit`` cleanup), and each new ``StreamingDataset`` opens a
handle to every prefix still registered. In one long pytest process the open file count
grows quadratically with the datasets built (we measured ~2,300 descriptors after one
integration file, and the whole suite in one process ran out of the 20,000 allowed). One
process per file bounds it. A fixture cannot bound it instead: the handles are reachable only
through streaming's ``atexit`` registrations, and closing them while a module- or
session-scoped dataset still maps them would pull the memory from under that dataset. The unit
tests build no ``StreamingDataset`` and share one process.

Why several at once: most groups spend much of their wall time waiting (interpreter and
``import streaming`` start-up, child processes, DDP rendezvous, servers), so a pool as large as
the usable CPUs (``os.sched_getaffinity``, at most :data:`MAX_LANES`) finishes sooner than one
group after another. The longest groups start first, by each file's seconds in the last full
run on this checkout (``.pytest_cache/bcl_group_seconds.json``; without one, the figures
committed in ``tests/group_seconds.json``, a 2-core run; a group of files in neither counts as
the longest). Each group's output is printed whole when it ends, and every group's wall time is
listed at the end, slowest first.

What makes concurrent groups safe, and what does not run concurrently:
- Mosaic Streaming's ``clean_stale_shared_memory()`` unlinks the shared memory of *every*
  streaming job on the machine, live ones included. Groups of the concurrent phase run with
  ``BCL_STREAM_KEEP_SHM=1`` (our job-start cleanup is skipped) and no test calls streaming's
  cleanup itself (every test reads from a fresh local directory, and streaming only refuses a
  reused one that a live or stale registration still names).
- A test file that must run the real cleanup carries the ``shm_cleanup`` marker (registered in
  ``pyproject.toml``). The runner finds it by reading the files (``pytestmark`` or a test's
  decorator naming ``pytest.mark.shm_cleanup``) and runs it without ``BCL_STREAM_KEEP_SHM`` and
  outside the lanes' band (below): its cleanup walks prefixes up from 0 and stops at the first
  free one, so it unlinks its own leftovers and never reaches the band where the other groups'
  memory lives.
- Every group gets its own ``TMPDIR``: streaming's lock files (named by its shared-memory
  prefix) and pytest's numbered temp dirs do not meet another group's. Servers bind port 0 on
  127.0.0.1; DDP tests pick a free port.
- Streaming picks a shared-memory prefix by looking for a free one, counting from 0, and
  creates it only after a barrier of the job's ranks, with no lock between processes: two
  groups building datasets at the same moment could take the same prefix (``FileExistsError``
  on ``*_locals``; a concurrent run lost a DDP test whose rank 0 died while rank 1 waited at
  that barrier, rank 0's own error cut from the log). Each lane (a slot of the pool) is
  kept to its own prefixes in a band above those other jobs use, by empty lock files of every
  other prefix in the group's ``TMPDIR`` (:func:`reserve_prefixes`); a test that gives its
  subprocesses another temp dir copies them (``bcl_bench/soak.py``). This also keeps
  the suite out of reach of streaming's cleanup run by another job on the machine (it stops at
  the first free prefix). The files marked ``shm_cleanup`` get no band.
- Test files marked ``shared_process`` build no ``StreamingDataset`` in the pytest process
  (their datasets are built in subprocesses, or they only write and parse): they are dealt
  into a few pytest processes (:data:`SHARED_GROUP_SECONDS`) instead of one each, which saves
  an interpreter start (``import streaming`` and torch, ~7 s of CPU) per file.

Why forked, and why that keeps the above: a process that imports torch, Lightning,
transformers and streaming spends about 8 s of CPU before its first test, and the suite's CPU is
bounded by the machine's 2 cores. The runner starts fork servers (``tools/fork_server.py``:
one in its environment, one with ``OMP_NUM_THREADS=1`` for the tests' Lightning fits and DDP
scripts) that import those modules and nothing else, and forks each group's pytest process
from the first (the group's own ``TMPDIR``, ``BCL_STREAM_KEEP_SHM``, working directory and
output file, as a fresh ``python -m pytest`` would have them). A group is still its own process: streaming was only
imported before the fork, so every dataset, shared-memory handle and ``atexit`` registration of
a group is made in that group's process and freed when it exits, and the bands and the
``shm_cleanup`` groups work as above. The server ``wait4``s each group and sends its CPU (its
own and its descendants') with its exit code, plus the CPU of the CLI runs the group's tests
had the server fork (``tests/cli_process.py``: the group's ``BCL_FORK_SERVER`` and
``BCL_FORK_TAG``), so each group's CPU below is still all of its work; the server's imports
count in the run's total. The server refuses an environment that differs from its own in a
variable read at import (``OMP_*``, ``HF_*``, ``PYTHON*``, ...; see its docstring): such a group
gets a fresh interpreter, and says so. ``BCL_TEST_FORK=0`` starts every group (and every CLI
run of the tests) fresh, to compare.

With ``--mypy`` (first argument; ``make test`` passes it) mypy runs beside the groups and a
type error fails the run like a failing test.

There is no retry: a test that fails fails the run. (An earlier version reran a failing group
once and passed it as FLAKY, for a rare SIGABRT of the 2-process gloo test on a loaded
machine that was never reproduced.) Arguments are passed to every pytest run.
"""

from __future__ import annotations

import ast
import json
import math
import os
import queue
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (make test): tools/ is first, not the checkout
    sys.path.insert(0, str(ROOT))

from tools.fork_client import Forked, ForkServer, Refused  # noqa: E402
from tools.fork_server import FORK_ENV, SERVER_ENV, TAG_ENV  # noqa: E402

CLEANUP_MARKER = "shm_cleanup"
SHARED_MARKER = "shared_process"
TYPECHECKED = ("bcl_stream", "lightning_module", "bcl_bench")
"""The packages mypy checks (``--mypy``; ``make typecheck`` names the same)."""
LAST_SECONDS = ROOT / ".pytest_cache" / "bcl_group_seconds.json"
KNOWN_SECONDS = ROOT / "tests" / "group_seconds.json"
KEYS = ("tests", "failures", "errors", "skipped")
MAX_LANES = 4
"""At most this many groups at once: each imports torch (about 0.5-1 GB), and a lane keeps
BAND / lanes shared-memory prefixes (256 at 4 lanes; the heaviest files held 68 at once)."""
SHARED_GROUP_SECONDS = 200.0
"""The files marked ``shared_process`` are dealt into groups of at most about this many seconds
(by the last run's figures). Two groups of 460 and 340 s were the longest of the run, and the
lanes' ends are only as even as the last groups are short; each group more costs one
interpreter start (about 8 s of CPU)."""
BAND = 1024
"""Shared-memory prefixes of one run, dealt to its lanes (a group holds a few dozen at most).
The band starts at ``BAND * (1 + pid % 8)``: above any other job's prefixes, and usually not
another run's band."""


@dataclass
class Group:
    """One pytest process: the paths it runs and what it reported."""

    name: str
    paths: list[str]
    cleans_shm: bool = False
    seconds: float = 0.0
    cpu: float = 0.0
    code: int = 0
    max_fds: int = 0
    files: dict[str, float] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEYS, 0))

    @property
    def failed(self) -> bool:
        return self.code not in (0, 5) or bool(self.totals["failures"] or self.totals["errors"])


def raise_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def counts(report: Path) -> dict[str, int]:
    totals = dict.fromkeys(KEYS, 0)
    if not report.exists():
        return totals
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    return totals


def file_marks(path: Path) -> set[str]:
    """The ``pytest.mark.NAME`` names a file uses (at module level or on a test)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    }


def find_groups(seconds: dict[str, float], workers: int) -> list[Group]:
    """The unit tests; every integration file in its own group, but the files marked
    ``shared_process``, dealt longest first into groups of about equal seconds: ``workers`` of
    them, or more where that keeps each under :data:`SHARED_GROUP_SECONDS`."""
    groups = [Group("tests/unit", ["tests/unit"])]
    shared: list[str] = []
    for path in sorted((ROOT / "tests/integration").glob("test_*.py")):
        name, marks = str(path.relative_to(ROOT)), file_marks(path)
        if SHARED_MARKER in marks and CLEANUP_MARKER not in marks:
            shared.append(name)
        else:
            groups.append(Group(name, [name], cleans_shm=CLEANUP_MARKER in marks))
    total = sum(seconds.get(name, 60.0) for name in shared)
    count = min(len(shared), max(workers, math.ceil(total / SHARED_GROUP_SECONDS)))
    batches: list[list[str]] = [[] for _ in range(count)]
    load = [0.0] * len(batches)
    for name in sorted(shared, key=lambda n: -seconds.get(n, 60.0)):
        lightest = load.index(min(load))
        batches[lightest].append(name)
        load[lightest] += seconds.get(name, 60.0)
    for i, batch in enumerate(batches):
        groups.append(Group(f"shared process {i + 1} ({len(batch)} files)", sorted(batch)))
    return groups


def file_seconds(report: Path) -> dict[str, float]:
    """Seconds of each file's tests (setup, call, teardown) from a junit report."""
    got: dict[str, float] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("classname", "").split(".")
            while name and not (ROOT / "/".join(name)).with_suffix(".py").is_file():
                name.pop()  # a class inside the file
            path = str(Path("/".join(name)).with_suffix(".py")) if name else "?"
            got[path] = got.get(path, 0.0) + float(case.get("time", 0.0))
    return got


def known_seconds() -> dict[str, float]:
    for source in (LAST_SECONDS, KNOWN_SECONDS):
        try:
            return {str(k): float(v) for k, v in json.loads(source.read_text()).items()}
        except (OSError, ValueError):
            continue
    return {}


def reserve_prefixes(tmpdir: Path, base: int, lane: int, lanes: int) -> None:
    """Keep streaming in ``tmpdir`` to the shared-memory prefixes ``base + lane + k * lanes``.

    Streaming 0.13 (``streaming/base/shared/prefix.py``) takes the first prefix, counting from
    0, with neither live shared memory nor a ``{prefix:06}_barrier_filelock`` file in the temp
    dir, and creates it only after a ``dist.barrier()`` of the job's ranks: two processes that
    look in that window take the same prefix and one fails (``FileExistsError`` on
    ``*_locals``; DDP ranks can wait seconds at that barrier). Empty lock
    files for every other prefix below the band's end make concurrent groups choose from
    disjoint sets, above the prefixes other jobs on the machine take. Streaming's
    ``clean_stale_shared_memory()``, run by another job, also counts from 0 and stops at the
    first free prefix, so it does not reach the band either.
    """
    for prefix in range(base + BAND):
        if prefix < base or (prefix - base) % lanes != lane:
            (tmpdir / f"{prefix:06}_barrier_filelock").touch()


def run_group(
    group: Group,
    argv: list[str],
    tmp: Path,
    index: int,
    lane: int = 0,
    lanes: int = 0,
    servers: Sequence[ForkServer] = (),
) -> str:
    """Run one pytest process (in ``lane`` of ``lanes`` running at once), forked from the
    first of ``servers`` where there is one (it refuses an environment it cannot serve: then a
    fresh ``python -m pytest``); fills in the group's counts, code, seconds and files; returns
    its output. The group's tests fork their runs from ``servers`` too."""
    own_tmp = tmp / f"g{index}"
    own_tmp.mkdir()
    if lanes:
        reserve_prefixes(own_tmp, BAND * (1 + os.getpid() % 8), lane, lanes)
    report = tmp / f"g{index}.xml"
    env = {**os.environ, "TMPDIR": str(own_tmp)}
    if group.cleans_shm:
        env.pop("BCL_STREAM_KEEP_SHM", None)
    else:
        env["BCL_STREAM_KEEP_SHM"] = "1"
    args = ["-q", "-ra", f"--junitxml={report}", *argv, *group.paths]
    started = time.monotonic()
    with open(tmp / f"g{index}.out", "w+", errors="replace") as out:
        child: subprocess.Popen[bytes] | Forked | None = None
        if servers:
            addresses = os.pathsep.join(s.address for s in servers)
            env.update({SERVER_ENV: addresses, TAG_ENV: str(index)})
            try:
                child = servers[0].fork(
                    "pytest", args, env=env, cwd=ROOT, fds=[0, out.fileno(), out.fileno()],
                    owns=str(index),
                )  # fmt: skip
            except Refused as why:
                out.write(f"(fresh pytest process: the fork server refused: {why})\n")
                out.flush()
        if child is None:
            child = subprocess.Popen(
                [sys.executable, "-m", "pytest", *args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        group.code, group.cpu = wait_watching(child, group)
        out.seek(0)
        output = out.read()
    group.seconds = time.monotonic() - started
    group.totals = counts(report)
    group.files = file_seconds(report)
    if len(group.paths) == 1 and group.paths[0].endswith(".py"):
        group.files = {group.paths[0]: group.seconds}
    return output


def wait_watching(proc: subprocess.Popen[bytes] | Forked, group: Group) -> tuple[int, float]:
    """Wait for a group's pytest process, noting the most descriptors it holds (streaming keeps
    them open); returns its exit code and CPU seconds. The CPU comes from ``wait4``: the
    process's and that of every descendant it waited for (DDP ranks, CLI runs, servers), which
    the run's total alone cannot split by group when groups run at once; for a forked group the
    fork server waits for it and adds the CPU of the runs its tests had the server fork."""
    if isinstance(proc, Forked):
        while (result := proc.poll(1.0)) is None:
            group.max_fds = max(group.max_fds, open_fds(proc.pid))
        return result
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        group.max_fds = max(group.max_fds, open_fds(proc.pid))
        time.sleep(1.0)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # gone, or no /proc
        return 0


def report_group(group: Group, output: str) -> None:
    print(f"\n=== {group.name} ({group.seconds:.0f} s)\n{output.rstrip()}", flush=True)


def run_concurrently(
    groups: list[Group],
    argv: list[str],
    tmp: Path,
    workers: int,
    servers: Sequence[ForkServer] = (),
) -> None:
    free_lanes: queue.SimpleQueue[int] = queue.SimpleQueue()
    for lane in range(workers):
        free_lanes.put(lane)

    def in_a_lane(group: Group, index: int) -> str:
        lane = free_lanes.get()  # a pool thread runs one group at a time: one lane is free
        try:  # a shm_cleanup group runs below the band (module docstring)
            band = 0 if group.cleans_shm else workers
            return run_group(group, argv, tmp, index, lane, band, servers)
        finally:
            free_lanes.put(lane)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: dict[Future[str], Group] = {
            pool.submit(in_a_lane, group, i): group for i, group in enumerate(groups)
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                report_group(pending.pop(future), future.result())


def lanes() -> int:
    """Groups at once: the usable CPUs, at most :data:`MAX_LANES`; ``BCL_TEST_LANES=N`` sets
    another count (to measure whether a lane more than the cores pays where groups wait on
    child processes, servers and sleeps)."""
    chosen = os.environ.get("BCL_TEST_LANES", "")
    if chosen:
        if not chosen.isdigit() or not 1 <= int(chosen) <= MAX_LANES:
            raise SystemExit(
                f"BCL_TEST_LANES={chosen!r}: give a whole number from 1 to {MAX_LANES}"
            )
        return int(chosen)
    return max(1, min(MAX_LANES, len(os.sched_getaffinity(0))))


def start_typecheck(tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """mypy over the packages, started beside the test groups (``--mypy``, what ``make test``
    passes): on a fresh checkout it is ~40 s of one core's work with no cache, which the pool's
    lanes absorb instead of the suite waiting for it first."""
    log = tmp / "mypy.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mypy", *TYPECHECKED],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def start_servers(tmp: Path) -> list[ForkServer]:
    """The fork servers (``tools/fork_server.py``): the first, in this process's environment,
    forks the groups and the tests' runs in that environment; the second has
    ``OMP_NUM_THREADS=1``, the environment the tests give their Lightning fits and DDP scripts
    (a start-up variable: a server of another value refuses them). Each has its own temp dir (a
    child's ``TMPDIR`` is set in the child) and its messages in ``tmp/fork-server-N.err``. None
    with ``BCL_TEST_FORK=0`` (every group a fresh interpreter, to compare); a server that fails
    to start is said, and its runs start fresh interpreters."""
    if os.environ.get(FORK_ENV) == "0":
        return []
    servers = []
    kinds = [{}, {"OMP_NUM_THREADS": "1"}]
    if os.environ.get("OMP_NUM_THREADS") == "1":  # the first serves both
        kinds.pop()
    for i, extra in enumerate(kinds):
        own_tmp = tmp / f"fork-server-{i}"
        own_tmp.mkdir()
        env = {**os.environ, **extra, "TMPDIR": str(own_tmp)}
        try:
            servers.append(ForkServer.start(env, log=tmp / f"fork-server-{i}.err"))
        except (OSError, RuntimeError) as exc:
            print(f"fork server {i}: {exc}; its runs start their own interpreter", flush=True)
    return servers


def main(argv: list[str]) -> int:
    typecheck = bool(argv) and argv[0] == "--mypy"
    argv = argv[1:] if typecheck else argv
    raise_open_file_limit()
    seconds = known_seconds()
    workers = lanes()
    groups = find_groups(seconds, workers)

    def expected(group: Group) -> float:  # a group of unknown files counts as the longest
        known = [
            s for f, s in seconds.items() for p in group.paths if f == p or f.startswith(p + "/")
        ]
        return sum(known) if known else float("inf")

    together = sorted(groups, key=lambda g: -expected(g))
    cleaning = [g for g in groups if g.cleans_shm]
    started, cpu_before = time.monotonic(), os.times()
    mypy_failed = False
    with tempfile.TemporaryDirectory(prefix="bcl-") as tmp:
        mypy = start_typecheck(Path(tmp)) if typecheck else None
        servers = start_servers(Path(tmp))
        try:
            run_concurrently(together, argv, Path(tmp), workers, servers)
        finally:
            for server in servers:
                server.close()
                for tag, seconds in server.unclaimed.items():  # runs of a group's tests
                    together[int(tag)].cpu += seconds
        if mypy is not None:
            proc, log = mypy
            mypy_failed = proc.wait() != 0
            print(f"\n=== mypy {' '.join(TYPECHECKED)}\n{log.read_text().rstrip()}", flush=True)
    wall = time.monotonic() - started
    cpu_after = os.times()
    cpu = (cpu_after.children_user - cpu_before.children_user) + (
        cpu_after.children_system - cpu_before.children_system
    )

    print("\ngroup seconds, wall and CPU (most open files), slowest first:")
    for group in sorted(groups, key=lambda g: -g.seconds):
        cleanup_note = "  (below the band, real cleanup)" if group.cleans_shm else ""
        print(
            f"{group.seconds:7.1f} {group.cpu:7.1f}  ({group.max_fds:5d})  {group.name}"
            f"{cleanup_note}"
        )
    if not argv:  # a partial run (-k, -x, ...) would order the next full run badly
        measured = {path: round(s, 1) for g in groups for path, s in g.files.items()}
        LAST_SECONDS.parent.mkdir(exist_ok=True)
        LAST_SECONDS.write_text(json.dumps(measured, indent=0, sort_keys=True) + "\n")
    total = {key: sum(g.totals[key] for g in groups) for key in KEYS}
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    failed = total["failures"] + total["errors"]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\ntest groups: {len(groups)} ({workers} at once, {len(cleaning)} below the band), "
        f"wall {wall:.0f} s, CPU {cpu:.0f} s, load average (1, 5, 15 min) {load}"
    )
    for group in groups:
        if group.failed:
            print(f"FAILED group: {group.name} (pytest exit code {group.code})")
    if mypy_failed:
        print("FAILED: mypy (its output is above)")
    print(f"{passed} passed, {failed} failed, {total['skipped']} skipped")
    return 1 if any(g.failed for g in groups) or total["tests"] == 0 or mypy_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
