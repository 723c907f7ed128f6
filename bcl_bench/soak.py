"""The kill-and-resume harness: a 2-rank DDP LightningCLI run (gloo, CPU) SIGKILLed again and
again in one job, each time resumed from the last complete checkpoint.

Used by ``tests/integration/test_reliability_crash.py`` (one kill, and a 3-kill soak) and by
``tools/soak.py`` (10 kills, results JSON); the job's config is ``soak_config``, its slow-down
callbacks ``soak_callbacks``. Kill moments, drawn from a seed:

- ``step``: once rank 0 has logged a random step after the resume point (mid-epoch, DataLoader
  workers mid-prefetch when the run has workers);
- ``save``: inside ``trainer.save_checkpoint`` (the ``SlowSave`` callback marks the save and
  holds it open for a moment; the kill lands before the file is complete);
- ``startup``: a random moment in the first seconds of the process (imports, DDP setup,
  checkpoint restore).

The whole process group is killed (launcher, both ranks, their workers), as a node failure or
an OOM kill would. ``PackLogger`` lines are the record of what each rank trained: each segment
counts from its resume step up to the step the next segment resumes from. The result is
compared with an uninterrupted run, per step and per rank.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bcl_bench.harness import ROOT, checkout_env
from bcl_bench.soak_config import write_config
from lightning_module.checkpoints import last_complete_checkpoint

KINDS = ("step", "save", "startup")


def private_tmpdir() -> Path:
    """A fresh temp dir for the runs (streaming's lock files land there: leftovers we can see),
    short and directly under ours: DataLoader workers open AF_UNIX sockets in it
    (multiprocessing's resource sharer), whose paths must stay under 108 bytes, which a dir
    under pytest's ``tmp_path`` inside a test runner's temp dir is not. It holds the lock
    files of the streaming shared-memory prefixes reserved in ours: ``tools/run_tests.py``
    reserves each concurrent test group's own prefixes that way, so this job's ranks cannot
    pick a prefix another group is taking."""
    path = Path(tempfile.mkdtemp(prefix="soak-"))
    for lock in Path(tempfile.gettempdir()).glob("*_barrier_filelock"):
        (path / lock.name).touch()
    return path


class Job(Protocol):
    """A started run: what this harness uses of ``subprocess.Popen``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def communicate(self, *, timeout: float | None = None) -> tuple[Any, Any]: ...


Start = Callable[[list[str], dict[str, str]], Job]
"""Starts ``python -m lightning_module ARGS`` in ``env`` from the checkout's root, in a new
session (one process group: launcher, both ranks, their workers), its stdout and stderr
together in ``communicate()``'s first item."""


def fresh_start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """:data:`Start` as a new interpreter."""
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_module", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # one process group: launcher + both ranks + workers
    )


def launch(config: Path, tmpdir: Path, *extra: str, start: Start = fresh_start) -> Job:
    env = checkout_env(OMP_NUM_THREADS="1", TMPDIR=str(tmpdir))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    return start(["fit", "--config", str(config), *extra], env)


def finish(proc: Job, timeout: float = 240) -> None:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]


def pack_lines(logs: Path, rank: int) -> list[dict[str, Any]]:
    """Complete lines of one rank's pack log (a killed writer may leave a cut last line)."""
    path = logs / f"packs_rank{rank}.jsonl"
    if not path.is_file():
        return []
    complete = path.read_text().split("\n")[:-1]  # after the last newline: unfinished or empty
    return [json.loads(line) for line in complete if line.strip()]


def by_step(logs: Path, rank: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in pack_lines(logs, rank):
        assert line["step"] not in out, f"rank {rank} logged step {line['step']} twice"
        out[line["step"]] = line["sample_ids"]
    return out


def checkpoint_step(path: Path) -> int:
    match = re.match(r"step=(\d+)", path.stem)
    assert match, path
    return int(match.group(1))


def kill_group(proc: Job) -> str:
    """SIGKILL the run's whole process group; returns what it printed."""
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out.decode(errors="replace") if out else ""


def wait_and_kill(
    proc: Job, kind: str, logs: Path, markers: Path, after: int, target: int,
    delay: float, timeout: float = 180,
) -> bool:  # fmt: skip
    """Kill the run at the moment ``kind`` describes; False if it ended first."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            return False
        if kind == "startup" and time.monotonic() - start >= delay:
            break
        if kind == "step" and max(by_step(logs, 0), default=-1) >= target:
            break
        if kind == "save" and any(saved > after for saved in _saves(markers)):
            break
        time.sleep(0.005)
    else:
        printed = kill_group(proc)[-4000:]
        raise AssertionError(f"no {kind} kill within {timeout} s; the run printed:\n{printed}")
    kill_group(proc)
    return True


def _saves(markers: Path) -> list[int]:
    """Steps whose checkpoint save began (markers written by ``SlowSave``)."""
    found = markers.glob("saving-*") if markers.is_dir() else []
    return sorted(int(m.name.split("-")[1]) for m in found)


def reference_run(
    data: Path, work: Path, *, every: int = 5, workers: int = 0, start: Start = fresh_start
) -> list[dict[int, list[int]]]:
    """The uninterrupted run: per rank, step -> record ids (``start``: see :func:`soak`)."""
    tmpdir = private_tmpdir()
    config = write_config(
        work / "reference.yaml", data=data, work=work / "reference", every=every,
        workers=workers, persistent=workers > 0,
    )  # fmt: skip
    finish(launch(config, tmpdir, start=start))
    reference = [by_step(work / "reference" / "logs", r) for r in (0, 1)]
    steps = len(reference[0])
    assert steps > 0 and sorted(reference[0]) == list(range(steps)) == sorted(reference[1])
    return reference


def soak(
    data: Path, work: Path, reference: list[dict[int, list[int]]], *, kills: int, seed: int,
    every: int = 5, workers: int = 1, kinds: tuple[str, ...] = KINDS, start: Start = fresh_start,
) -> dict[str, Any]:  # fmt: skip
    """One job killed ``kills`` times (kinds in turn), each time resumed from the last
    complete checkpoint; return what happened. ``reference``: :func:`reference_run`'s output
    (DataLoader workers do not change what is trained, so one reference serves any count).
    ``start`` starts each run (the tests fork it from a pre-imported server: the same run
    without the launcher's imports); a run to be killed during start-up is always a new
    interpreter, so its kill moment is drawn over a real start-up, imports included.

    Raises AssertionError (with the seed) if the job trains other records than the reference,
    per step and per rank, or leaves an unreadable checkpoint behind.
    """
    import torch

    rng = random.Random(seed)
    tmpdir = private_tmpdir()
    common: dict[str, Any] = {
        "data": data,
        "every": every,
        "workers": workers,
        "persistent": workers > 0,
    }
    steps = len(reference[0])

    ckpt_dir = work / "ckpt"
    segments: list[dict[str, Any]] = []
    resume: Path | None = None
    t1 = time.monotonic()
    for i in range(kills + 1):
        seg_dir = work / f"segment{i}"
        kind = kinds[i % len(kinds)] if i < kills else "none"
        after = checkpoint_step(resume) if resume else 0
        config = write_config(
            work / f"segment{i}.yaml", work=seg_dir, ckpt=ckpt_dir, sleep=0.05,
            save_sleep=0.5 if kind == "save" else 0.0, **common,
        )  # fmt: skip
        before = {p.name: p.stat().st_mtime_ns for p in ckpt_dir.glob("*.ckpt")}
        proc = launch(
            config, tmpdir, *(["--ckpt_path", str(resume)] if resume else []),
            start=fresh_start if kind == "startup" else start,
        )  # fmt: skip
        target = min(after + rng.randint(1, 2 * every + 1), steps - 2)
        delay = rng.uniform(0.5, 8.0)
        info: dict[str, Any] = {"kind": kind, "resumed_at": after, "target_step": target}
        if kind == "none":
            finish(proc)
            killed = False
        else:
            killed = wait_and_kill(
                proc, kind, seg_dir / "logs", seg_dir / "markers", after, target, delay
            )
            if not killed:
                finish(proc)
        logged = max(by_step(seg_dir / "logs", 0), default=None)
        info.update(killed=killed, last_step_logged=logged, startup_delay=round(delay, 2))
        if kind == "save" and killed:
            saving = _saves(seg_dir / "markers")
            info["killed_while_saving_step"] = saving[-1] if saving else None
            written = [
                p for p in ckpt_dir.glob("*.ckpt") if before.get(p.name) != p.stat().st_mtime_ns
            ]
            info["that_checkpoint_was_written"] = any(
                checkpoint_step(p) == info["killed_while_saving_step"] for p in written
            )
        segments.append(info)
        if not killed:
            break
        resume = last_complete_checkpoint(ckpt_dir)
    seconds_soak = time.monotonic() - t1

    # What was trained: segment i from its resume step up to the next segment's resume step.
    ctx = f"(seed {seed}: {segments})"
    trained: list[dict[int, list[int]]] = [{}, {}]
    replayed = 0
    for i, info in enumerate(segments):
        lo = info["resumed_at"]
        hi = segments[i + 1]["resumed_at"] if i + 1 < len(segments) else steps
        for rank in (0, 1):
            log = by_step(work / f"segment{i}" / "logs", rank)
            if log:
                assert min(log) == lo, f"segment {i} rank {rank} began at {min(log)} {ctx}"
            kept = {s: ids for s, ids in log.items() if lo <= s < hi}
            assert sorted(kept) == list(range(lo, hi)), f"segment {i} rank {rank} lost steps {ctx}"
            assert not set(kept) & set(trained[rank]), f"step trained twice {ctx}"
            trained[rank].update(kept)
            replayed += sum(1 for s in log if s >= hi)
    want = Counter(i for r in (0, 1) for s in range(steps) for i in reference[r][s])
    got = Counter(i for r in (0, 1) for ids in trained[r].values() for i in ids)
    lost, duplicated = sum((want - got).values()), sum((got - want).values())
    for rank in (0, 1):
        assert trained[rank] == reference[rank], f"rank {rank} differs from the reference {ctx}"

    unreadable = []
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        try:
            torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except Exception as exc:
            unreadable.append(f"{path.name}: {type(exc).__name__}")
    assert not unreadable, f"unreadable checkpoints left behind: {unreadable} {ctx}"
    return {
        "seed": seed,
        "kills_planned": kills,
        "kills": sum(s["killed"] for s in segments),
        "kills_by_kind": {k: sum(s["killed"] and s["kind"] == k for s in segments) for k in KINDS},
        "kills_inside_a_save_before_its_file_was_written": sum(
            s["kind"] == "save" and s["killed"] and not s["that_checkpoint_was_written"]
            for s in segments
        ),
        "steps_per_rank": steps,
        "records_per_rank_step": len(reference[0][0]),
        "records_trained": sum(got.values()),
        "records_lost": lost,
        "records_duplicated": duplicated,
        "steps_replayed_after_a_kill": replayed,
        "identical_to_reference": True,
        "checkpoints_left": len(list(ckpt_dir.glob("*.ckpt"))),
        "unreadable_checkpoints": len(unreadable),
        "dataloader_workers": workers,
        "persistent_workers": workers > 0,
        "seconds_killed_and_resumed_job": round(seconds_soak, 1),
        "segments": segments,
    }
