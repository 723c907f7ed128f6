"""Concurrent writers: a second ``preprocess`` (or ``annotate``) aimed at an output another live
process is writing is refused at once, naming the holder; a killed writer's lock is taken over.

The first writer is a real ``bcl-stream preprocess`` in its own process, slow enough (a few
thousand records through the cl100k tokenizer) to be caught mid-write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.preprocess.lock import lock_path, output_lock

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.shared_process]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("in") / "docs.jsonl"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    with path.open("w") as fh:
        for i in range(60_000):
            text = " ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 40))
            fh.write(json.dumps({"text": f"{i}: {text}"}) + "\n")
    return path


def start_writer(corpus: Path, out: Path) -> subprocess.Popen[bytes]:
    """A real preprocess run into ``out``; returns once it holds the output lock."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bcl_stream.cli", "preprocess", str(corpus), "--output", str(out),
         "--format", "wds", "--workers", "1", "--no-progress", "--cost-model", "tokens"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not lock_path(out).is_file():
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        assert time.monotonic() < deadline, "the writer never took the lock"
        time.sleep(0.02)
    return proc


def test_live_writer_refuses_a_second_then_a_killed_one_is_taken_over(
    corpus: Path, tmp_path: Path
) -> None:
    from bcl_stream.preprocess import preprocess
    from bcl_stream.preprocess.annotate import annotate

    out = tmp_path / "ds"
    first = start_writer(corpus, out)
    try:
        holder = rf"being written by pid {first.pid} on .*\(preprocess, started .*\).*Wait"
        t0 = time.monotonic()
        with pytest.raises(DatasetError, match=holder):
            preprocess([str(corpus)], str(out), format="wds", overwrite=True, progress=False)
        assert time.monotonic() - t0 < 5, "refused at once, not after waiting"
        with pytest.raises(DatasetError, match=holder):
            annotate(out, overwrite=True, progress=False)
        assert first.poll() is None, "the refused runs must not disturb the live writer"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert lock_path(out).is_file()  # a killed writer leaves its lock file behind
    with pytest.warns(UserWarning, match=rf"taking over the write lock of pid {first.pid} "):
        report = preprocess(
            [str(corpus)], str(out), format="wds", overwrite=True, progress=False,
            cost_model="tokens", maxcount=4000,
        )  # fmt: skip
    assert report.records_written == 60_000
    assert not lock_path(out).exists(), "a finished writer removes its lock file"


def test_a_finished_writer_releases_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    for _ in range(2):
        with output_lock(out, "preprocess") as path:
            assert json.loads(path.read_text())["pid"] == os.getpid()
        assert not path.exists()


def test_second_lock_in_the_same_process_is_refused(tmp_path: Path) -> None:
    """flock is per open file: even one process cannot write the same output twice."""
    out = tmp_path / "ds"
    with (
        output_lock(out, "preprocess"),
        pytest.raises(DatasetError, match="being written by"),
        output_lock(str(out) + "/", "annotate"),
    ):
        pass


def test_remote_outputs_are_locked_per_machine(tmp_path: Path) -> None:
    with (
        output_lock("s3://bucket/data", "preprocess"),
        pytest.raises(DatasetError, match=r"s3://bucket/data/? is being written"),
        output_lock("s3://bucket/data/", "annotate"),
    ):
        pass
