"""What the two demos (``tools/demo.py``, ``tools/demo_mixture.py``) share: where they write,
the corpus they train on, training in a fresh process, and reading what each rank trained.

Every training job is a separate ``python -m lightning_module fit`` process, as a user runs
it: its output goes to a log file, whose tail is shown if the job fails. Importing this module
loads no torch or Lightning (the pack log reader is imported where it is used).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bcl_bench.corpora import build_stdlib_corpus
from bcl_bench.harness import RESULTS, ROOT


def demo_dirs(name: str) -> tuple[Path, Path]:
    """``(results/NAME, results/NAME/work)``: the report's directory and the scratch one."""
    out = RESULTS / name
    return out, out / "work"


def stdlib_corpus(work: Path, records: int) -> tuple[Path, int]:
    """The stdlib chat corpus (at most ``records`` records) written to ``work/stdlib.jsonl``:
    its path and how many records it holds."""
    corpus = work / "stdlib.jsonl"
    return corpus, build_stdlib_corpus(corpus, limit=records)


def fit(config: Path, log: Path, *extra: str, threads: int | None = None) -> float:
    """``python -m lightning_module fit --config CONFIG EXTRA`` in a fresh process from the
    checkout's root, its output written to ``log``; its wall seconds. ``threads``: torch's
    OpenMP threads per rank (``OMP_NUM_THREADS``). A failed job ends the demo with the log's
    last 40 lines."""
    env = {**os.environ, **({} if threads is None else {"OMP_NUM_THREADS": str(threads)})}
    cmd = [sys.executable, "-m", "lightning_module", "fit", "--config", str(config), *extra]
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise SystemExit(f"demo: {config.name} failed (exit {proc.returncode}); {log}:\n{tail}")
    return time.perf_counter() - start


def rank_logs(logs: Path, world: int) -> list[list[dict[str, Any]]]:
    """What each of ``world`` ranks trained, step by step (``packs_rank{r}.jsonl`` under
    ``logs``, written by ``PackLogger``)."""
    from lightning_module.callbacks import read_pack_log

    return [read_pack_log(logs / f"packs_rank{r}.jsonl") for r in range(world)]
