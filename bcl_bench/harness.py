"""What every benchmark under ``tools/`` shares: its arguments, the machine stamp, where its
figures go, and runs of one measurement on one core.

Why one harness:

- **One machine stamp** (:func:`machine_stamp`), one set of keys in every results file, so two
  runs are compared machine to machine before figure to figure (the development machine is a
  shared 2-core box: its load average says more about a timing than its CPU model does).
- **One writer** (:func:`write_result`): every results file has the same form (indent 1 and a
  final newline, so a rerun diffs line by line against the committed one), carries the stamp
  under ``"machine"``, and its PNG is drawn from exactly the dict that was written.
- **One parser** (:func:`bench_parser`): ``--out`` (and ``--quick`` where a benchmark has a
  quick mode) spelled and defaulted alike everywhere.
- **One table form** (:func:`markdown_table`): the tables docs/ carry, printed by each
  benchmark's ``--markdown``, with the separator row counted from the header.
- **One-core runs** (:func:`run_on_one_core`): each planning row in its own process pinned to
  one core, so caches, memory peaks and thread pools of one row never leak into the next.

Light on purpose: numpy and the standard library only (versions of other packages are read
from their metadata, not by importing them), so a script that imports it starts fast and runs
where streaming or webdataset are not installed (the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package lives in (it is used from a checkout: an editable install or the
root on the path): benchmarks write under ``ROOT / "results"`` by default."""
RESULTS = ROOT / "results"
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""The thread pools a one-core run limits to one thread."""


def bench_parser(
    doc: str | None, out: Path, *, quick: str | None = None, out_help: str = "result JSON"
) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of ``doc`` (the script's docstring)
    with ``--out`` (default ``out``) and, when ``quick`` says what a quick run does,
    ``--quick``. The benchmark adds its own arguments to it."""
    description = (doc or "").strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=out, help=f"{out_help} (default: %(default)s)")
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def parse_or_print_table(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    markdown: Callable[[dict[str, Any]], str],
) -> argparse.Namespace | None:
    """``argv`` parsed with ``--markdown FILE`` added, or None once the table of that result
    JSON is printed: a benchmark's docs table is redrawn from a committed result, not rerun."""
    parser.add_argument(
        "--markdown", type=Path, default=None, help="only print the table of this result JSON"
    )
    args = parser.parse_args(argv)
    if args.markdown is None:
        return args
    print(markdown(json.loads(args.markdown.read_text())), end="")
    return None


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: the header of ``columns``, its separator row, one line per row."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def _cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """``git ARGS`` in the checkout, or None where git or the repository is missing (the GPU
    machine gets the working tree without ``.git``)."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_stamp() -> dict[str, Any]:
    """Where and when a result was measured, under the same keys in every results file: CPU
    model and count (all, and usable by this process), load average over 1/5/15 minutes,
    Python, numpy and torch versions, the git commit and whether the tree had uncommitted
    changes, and the UTC date."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    status = _git("status", "--porcelain")
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_uncommitted_changes": None if status is None else bool(status),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (``json`` knows only the latter)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_result(
    result: dict[str, Any],
    out: Path,
    plot: Callable[[dict[str, Any], Path], object] | None = None,
    *,
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``result`` with the machine stamp under ``"machine"`` to ``out`` (its directory
    created) and, given ``plot``, draw it to ``out`` with the suffix ``.png``; say so on stderr
    (stdout stays the benchmark's own); returns what was written. ``machine``: a stamp taken earlier (at the start of a long run, so its load
    average is the one the run started under); by default one taken now."""
    written = {**result, "machine": machine if machine is not None else machine_stamp()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(written, indent=1, default=_plain) + "\n")
    drawn = ""
    if plot is not None:
        plot(written, out.with_suffix(".png"))
        drawn = f" and {out.with_suffix('.png').name}"
    print(f"wrote {out}{drawn}", file=sys.stderr)
    return written


def checkout_env(code: Path = ROOT, **extra: str) -> dict[str, str]:
    """The environment for a child process of a benchmark (``python tools/NAME.py --child``
    and the like): this one, ``extra``, and ``code`` then this checkout first on
    ``PYTHONPATH``, so the child imports the same ``bcl_stream`` and ``bcl_bench`` whether
    or not the project is installed."""
    paths = [
        str(code),
        str(ROOT),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def run_on_one_core(args: list[str], code: Path = ROOT) -> dict[str, Any]:
    """``python ARGS`` (a script and its arguments, or ``-m MODULE ...``) pinned to core 0
    where ``taskset`` exists (Linux), with BLAS/OpenMP thread pools of 1 and the checkout
    ``code`` first on its ``PYTHONPATH`` (so the child imports that checkout's ``bcl_stream``:
    a benchmark can time the code before a change) and this one after it (for ``bcl_bench``,
    which an older checkout may lack); the last line of its stdout, parsed as JSON."""
    env = checkout_env(code, **dict.fromkeys(ONE_THREAD, "1"))
    cmd = [sys.executable, *args]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row
