"""Crash and resume: SIGKILL a 2-rank DDP training run (real LightningCLI, gloo on CPU), resume
from the last complete checkpoint, and prove that the records trained over the whole job equal
those of an uninterrupted run, per step and per rank.

The harness is ``bcl_bench/soak.py`` (also behind ``tools/soak.py``, 10 kills). Two
jobs here: one kill at a random step (no DataLoader workers), and a soak killed three times in
one job with a persistent DataLoader worker per rank: at a random step, inside a checkpoint save,
and at a random moment of start-up or restore. The whole process group is killed each time, so
every resume also starts over the killed run's leftovers (shared memory, lock files, a pack log
whose last line may be cut).

Each run is ``python -m lightning_module`` forked from the tests' pre-imported server in a new
session (``tests/cli_process.py``'s ``start_module``; the launcher's imports are not paid again,
and ``os.killpg`` still reaches the launcher, both ranks and their workers), but the run killed
at a moment of its start-up: that one is a new interpreter, so the moment is drawn over a real
start-up, imports included.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from cli_process import start_module

from bcl_bench.soak import Job, reference_run, soak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.shared_process]


def forked(args: list[str], env: dict[str, str]) -> Job:
    return start_module("lightning_module", *args, env=env, session=True)


def seed() -> int:
    return int(os.environ.get("BCL_CRASH_SEED", time.time_ns() % 100_000))


@pytest.fixture(scope="module")
def reference(
    mds_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[int, list[int]]]:
    """The uninterrupted run both jobs are compared with."""
    return reference_run(mds_dir, tmp_path_factory.mktemp("reference"), start=forked)


def test_sigkill_then_resume_trains_the_same_records(
    mds_dir: Path, tmp_path: Path, reference: list[dict[int, list[int]]]
) -> None:
    report = soak(
        mds_dir, tmp_path, reference, kills=1, seed=seed(), workers=0, kinds=("step",), start=forked
    )
    assert report["kills"] == 1, report  # BCL_CRASH_SEED=<seed> reproduces the kill step
    assert report["records_lost"] == report["records_duplicated"] == 0


def test_soak_three_kills_with_persistent_workers(
    mds_dir: Path, tmp_path: Path, reference: list[dict[int, list[int]]]
) -> None:
    """Killed at a step, inside a checkpoint save and during start-up, in one job: the job still
    trains exactly the reference's records and leaves no unreadable checkpoint."""
    report = soak(
        mds_dir, tmp_path, reference, kills=3, seed=seed(), workers=1,
        kinds=("step", "save", "startup"), start=forked,
    )  # fmt: skip
    assert report["kills_by_kind"] == {"step": 1, "save": 1, "startup": 1}, report
    assert report["kills_inside_a_save_before_its_file_was_written"] == 1, report
    assert report["records_lost"] == report["records_duplicated"] == 0
    assert report["unreadable_checkpoints"] == 0
