"""Run the test suite: unit tests in one pytest process, each integration file in its own.

Why separate processes: Mosaic Streaming 0.13 keeps every shared-memory handle it opens
alive until interpreter exit (``atexit`` cleanup), and each new ``StreamingDataset`` opens a
handle to every prefix still registered. In one long pytest process the open file count
grows quadratically with the datasets built (we measured ~2,300 descriptors after one
integration file, and the whole suite in one process ran out of the 20,000 allowed). One
process per file bounds it. A fixture cannot bound it instead: the handles are reachable only
through streaming's ``atexit`` registrations, and closing them while a module- or
session-scoped dataset still maps them would pull the memory from under that dataset. The unit
tests build no ``StreamingDataset`` and share one process. The summary line at the end adds up
every run's counts.

There is no retry: a test that fails fails the run. (An earlier version reran a failing group
once and passed it as FLAKY, for a rare SIGABRT of the 2-process gloo test on a loaded
machine that was never reproduced. One hazard it had is gone: its script called streaming's
``clean_stale_shared_memory()`` unconditionally, which unlinks the shared memory of every
streaming job on the machine, live ones included, where test suites of several checkouts run
at once. The gloo and DDP tests now set ``BCL_STREAM_KEEP_SHM=1`` and skip it.)
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def raise_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def counts(report: Path) -> dict[str, int]:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if not report.exists():
        return totals
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    return totals


def main(argv: list[str]) -> int:
    raise_open_file_limit()
    groups = [["tests/unit"]] + [
        [str(p.relative_to(ROOT))] for p in sorted((ROOT / "tests/integration").glob("test_*.py"))
    ]
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed_groups: list[str] = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i, paths in enumerate(groups):
            name = " ".join(paths)
            report = Path(tmp) / f"{i}.xml"
            cmd = [sys.executable, "-m", "pytest", "-q", "-ra", f"--junitxml={report}"]
            print(f"\n=== {name}", flush=True)
            code = subprocess.call([*cmd, *argv, *paths], cwd=ROOT)
            got = counts(report)
            for key in total:
                total[key] += got[key]
            if code not in (0, 5) or got["failures"] or got["errors"]:
                failed_groups.append(f"{name} (pytest exit code {code})")
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    failed = total["failures"] + total["errors"]
    print(f"\ntest groups: {len(groups)}, wall {time.time() - started:.0f} s")
    for group in failed_groups:
        print(f"FAILED group: {group}")
    print(f"{passed} passed, {failed} failed, {total['skipped']} skipped")
    return 1 if failed_groups or total["tests"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
