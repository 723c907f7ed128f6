"""Crash and resume: SIGKILL a 2-rank DDP training run (real LightningCLI, gloo on CPU) at a
random step after a checkpoint, resume from the last complete checkpoint, and prove that the
records trained over the whole run equal those of an uninterrupted run, per step and per rank.

The whole process group is killed (launcher and both ranks, as a node failure or an OOM kill
would), so the resumed run also starts over the killed run's leftovers: its shared memory,
lock files and a pack log whose last line may be cut. ``PackLogger`` lines are the record of
what each rank trained on: the killed run counts up to the checkpoint it is resumed from, the
resumed run from there on.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bcl_stream.integrity import last_complete_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPTS = Path(__file__).parent / "reliability_scripts"
sys.path.insert(0, str(SCRIPTS))
from run_config import write_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EVERY = 5
"""Checkpoint every EVERY optimizer steps."""
PACK = 4
STEPS = 2 * (300 // (2 * PACK))  # 2 epochs of 300 records on 2 ranks: 37 packs per epoch


def launch(config: Path, tmpdir: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(SCRIPTS)]),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmpdir),  # streaming's lock files land here: leftovers we can see
    }
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_module", "fit", "--config", str(config), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # one process group: launcher + both ranks
    )


def finish(proc: subprocess.Popen[bytes]) -> None:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]


def pack_lines(logs: Path, rank: int) -> list[dict]:  # type: ignore[type-arg]
    """Complete lines of one rank's pack log (a killed writer may leave a cut last line)."""
    path = logs / f"packs_rank{rank}.jsonl"
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is unfinished (or empty)
    return [json.loads(line) for line in complete if line.strip()]


def by_step(logs: Path, rank: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in pack_lines(logs, rank):
        assert line["step"] not in out, f"rank {rank} logged step {line['step']} twice"
        out[line["step"]] = line["sample_ids"]
    return out


def test_sigkill_then_resume_trains_the_same_records(mds_dir: Path, tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    seed = int(os.environ.get("BCL_CRASH_SEED", time.time_ns() % 100_000))
    kill_after = random.Random(seed).randrange(EVERY + 1, STEPS - 3)
    ctx = f"(BCL_CRASH_SEED={seed} reproduces the kill step {kill_after})"

    # 1. The uninterrupted run.
    full = tmp_path / "full"
    finish(
        launch(write_config(tmp_path / "full.yaml", data=mds_dir, work=full, every=EVERY), tmpdir)
    )
    reference = [by_step(full / "logs", r) for r in (0, 1)]
    assert sorted(reference[0]) == list(range(STEPS)) == sorted(reference[1])

    # 2. The same run, killed (whole process group, SIGKILL) once rank 0 logged `kill_after`.
    crashed = tmp_path / "crashed"
    config = write_config(
        tmp_path / "crashed.yaml", data=mds_dir, work=crashed, every=EVERY, sleep=0.05
    )
    proc = launch(config, tmpdir)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if max(by_step(crashed / "logs", 0), default=-1) >= kill_after:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be killed {ctx}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    killed_at = max(by_step(crashed / "logs", 0))
    assert killed_at < STEPS - 1, ctx

    # 3. Resume from the last checkpoint that loads, into a fresh pack log.
    ckpt = last_complete_checkpoint(crashed / "ckpt")
    assert ckpt is not None, "no complete checkpoint before the kill"
    resume_step = int(ckpt.stem.split("=")[1])
    assert EVERY <= resume_step <= killed_at + 1, ctx
    resumed = tmp_path / "resumed"
    config = write_config(tmp_path / "resumed.yaml", data=mds_dir, work=resumed, every=EVERY)
    finish(launch(config, tmpdir, "--ckpt_path", str(ckpt)))

    # 4. Killed run up to the checkpoint + resumed run == uninterrupted run, per step, per rank.
    for rank in (0, 1):
        before = {s: ids for s, ids in by_step(crashed / "logs", rank).items() if s < resume_step}
        after = by_step(resumed / "logs", rank)
        assert min(after) == resume_step, f"rank {rank} resumed at {min(after)} {ctx}"
        assert sorted(before) == list(range(resume_step)), f"rank {rank} lost a step {ctx}"
        assert {**before, **after} == reference[rank], (
            f"rank {rank}: killed after step {killed_at}, resumed at {resume_step} {ctx}"
        )
    # Each epoch, across both ranks, trains every planned record once (no record twice).
    per_epoch = STEPS // 2
    for epoch in range(2):
        steps = range(epoch * per_epoch, (epoch + 1) * per_epoch)
        ids = [i for r in (0, 1) for s in steps for i in reference[r][s]]
        assert len(ids) == len(set(ids))


def test_a_checkpoint_cut_short_by_the_kill_is_skipped(tmp_path: Path) -> None:
    """A kill while saving leaves the newest .ckpt truncated: resume takes the one before."""
    import torch

    for step in (5, 10):
        torch.save({"step": step, "weights": torch.zeros(1000)}, tmp_path / f"step={step}.ckpt")
        time.sleep(0.01)  # distinct modification times
    newest = tmp_path / "step=10.ckpt"
    assert last_complete_checkpoint(tmp_path) == newest
    newest.write_bytes(newest.read_bytes()[:1500])
    with pytest.warns(UserWarning, match=r"step=10\.ckpt: unreadable checkpoint skipped"):
        assert last_complete_checkpoint(tmp_path) == tmp_path / "step=5.ckpt"
    (tmp_path / "step=5.ckpt").write_bytes(b"")
    with pytest.warns(UserWarning):
        assert last_complete_checkpoint(tmp_path) is None
