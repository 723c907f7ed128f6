"""Crashed-run leftovers: shared memory and lock files of a SIGKILLed reader do not stop the
next run that starts the way our entry points start a job.

The victim reads an ``s3://`` dataset (loopback moto) with 2 DataLoader workers and is killed
as a whole process group (no atexit, no resource tracker: as after an OOM kill or node
failure). It leaves streaming's shared memory registered for its cache directory and its lock
files in the temp dir. Measured (streaming 0.13): a plain next run with the same temp dir reads
normally (streaming skips a prefix whose lock files exist); with another temp dir (a new job's
private TMPDIR) streaming refuses ("Reused local directory"), which our reader turns into a
DatasetError naming the fix; a run that does the job-start cleanup (``lightning_module`` does it
before anything is built) reads the whole epoch, exactly the plan.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cli_process import ForkedPopen, start_module
from conftest import write_mds
from pack_oracles import check_every_record_once

# shm_cleanup: the "job" run does the job-start cleanup, which unlinks the shared memory of every
# streaming job on the machine that it reaches (tools/run_tests.py runs this file below the
# other groups' shared-memory band, where the cleanup stops).
pytestmark = [pytest.mark.slow, pytest.mark.shm_cleanup, pytest.mark.timeout(240)]

Started = ForkedPopen | subprocess.Popen[bytes]
SCRIPTS = Path(__file__).parent / "reliability_scripts"
REPO = Path(__file__).resolve().parents[2]


def run(url: str, cache: Path, mode: str, tmpdir: Path) -> Started:
    """``python read_remote.py`` in its own process group, forked from the tests' server
    (``tests/cli_process.py``): streaming was only imported before the fork, so its shared
    memory, lock files and resource tracker are this run's, and ``os.killpg`` ends them as it
    ends a fresh interpreter's."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(SCRIPTS)]),
        "TMPDIR": str(tmpdir),
        "OMP_NUM_THREADS": "1",
    }
    script = SCRIPTS / "read_remote.py"
    return start_module(
        script, url, str(cache), mode, env=env, cwd=Path.cwd(), session=True, stderr=False
    )


def result(proc: Started) -> dict:  # type: ignore[type-arg]
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    return json.loads(out.decode().strip().splitlines()[-1])


def stale_registrations(cache: Path) -> list[str]:
    """Streaming ``*_locals`` shared-memory blocks that name ``cache``."""
    found = []
    for entry in Path("/dev/shm").glob("*_locals"):
        try:
            if str(cache).encode() in entry.read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_killed_reader_leftovers_do_not_stop_the_next_job(moto_s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = moto_s3(f"left-{os.getpid()}") + "/train"
    write_mds(url, 200)
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()

    victim = run(url, cache, "hang", tmpdir)
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == b"READY"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)

    assert stale_registrations(cache), "the kill left no shared memory (nothing to test)"
    assert list(tmpdir.glob("*_filelock")), "the kill left no lock files (nothing to test)"

    # Same temp dir: streaming skips a prefix whose lock files exist, so the stale lock files
    # steer the next run around the stale registration.
    same = result(run(url, cache, "plain", tmpdir))
    assert same.get("packs") == same.get("plan"), same
    # Another temp dir (a new job's private TMPDIR): the stale registration of this cache dir
    # is found and streaming refuses; our error names the fix.
    other = tmp_path / "tmp2"
    other.mkdir()
    plain = result(run(url, cache, "plain", other))
    assert plain.get("error") == "DatasetError", plain
    assert "clean_stale_shared_memory" in plain["message"]
    # The job-start cleanup our entry point runs: the same job reads the whole epoch.
    job = result(run(url, cache, "job", other))
    assert "error" not in job, job
    assert job["packs"] == job["plan"]
    check_every_record_once(job["packs"], job["plan"])
