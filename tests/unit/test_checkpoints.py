"""Finding the last complete checkpoint: by the archive's structure, never by unpickling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from hostile_pickle import RunsCode

from lightning_module.checkpoints import last_complete_checkpoint


def save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    time.sleep(0.01)  # distinct modification times
    return path


def test_a_checkpoint_cut_short_by_the_kill_is_skipped(tmp_path: Path) -> None:
    """A kill while saving leaves the newest .ckpt truncated: resume takes the one before."""
    for step in (5, 10):
        save(tmp_path / f"step={step}.ckpt", {"step": step, "weights": torch.zeros(1000)})
    newest = tmp_path / "step=10.ckpt"
    assert last_complete_checkpoint(tmp_path) == newest
    newest.write_bytes(newest.read_bytes()[:1500])
    with pytest.warns(UserWarning, match=r"step=10\.ckpt: unreadable checkpoint skipped"):
        assert last_complete_checkpoint(tmp_path) == tmp_path / "step=5.ckpt"
    (tmp_path / "step=5.ckpt").write_bytes(b"")
    with pytest.warns(UserWarning):
        assert last_complete_checkpoint(tmp_path) is None


@pytest.mark.parametrize("cut", [-1, -30, -200])
def test_any_cut_of_the_tail_is_caught(tmp_path: Path, cut: int) -> None:
    """The central directory is written last: losing any of it (or a byte of the last member
    before it) makes the file incomplete."""
    path = save(tmp_path / "a.ckpt", {"weights": torch.arange(100.0)})
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.warns(UserWarning, match="unreadable checkpoint skipped"):
        assert last_complete_checkpoint(tmp_path) is None


def test_a_damaged_pickle_record_is_caught(tmp_path: Path) -> None:
    path = save(tmp_path / "a.ckpt", {"step": 3, "weights": torch.zeros(10)})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"weights")  # inside data.pkl, stored uncompressed
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="Bad CRC"):
        assert last_complete_checkpoint(tmp_path) is None


def test_probing_never_runs_a_files_code(tmp_path: Path) -> None:
    """A checkpoint whose pickle runs code is found complete without being unpickled."""
    marker = tmp_path / "code-ran"
    older = save(tmp_path / "older.ckpt", {"step": 1})
    evil = save(tmp_path / "evil.ckpt", {"state": RunsCode(marker)})
    assert last_complete_checkpoint(tmp_path) == evil
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the control: unpickling it does run the code
    assert marker.is_dir()
    assert older.exists()
