"""Trainer resume: the packs after a resume equal the packs of the uninterrupted run, exactly.

One uninterrupted run per loader setting saves checkpoints at chosen steps; resumed runs
start from a checkpoint mid-epoch, at the epoch end and inside the next epoch, in a fresh
Trainer, and must log the same (step, epoch, record ids) as the uninterrupted run from that
step on. Settings: workers 0 and 2, persistent workers, both collate layouts, MDS and
WebDataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_scripts.harness import make_trainer, pack_log, packs_by_step, tail_from, tiny_config

from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

pytestmark = pytest.mark.slow

PACK = 8
EPOCHS = 2


@pytest.fixture
def data(request: pytest.FixtureRequest, mds_dir: Path) -> Path:
    """The MDS dataset, or the WebDataset one when the test case asks for ``format=wds``."""
    fmt = getattr(request, "param", "mds")
    return request.getfixturevalue("wds_dir") if fmt == "wds" else mds_dir


def datamodule(root: Path, **kwargs: Any) -> BCLDataModule:
    return BCLDataModule(str(root), pack_size=PACK, window=4, seed=3, **kwargs)


def fit(workdir: Path, dm: BCLDataModule, ckpt: Path | None = None, **kwargs: Any) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(workdir, max_epochs=EPOCHS, **kwargs)
    trainer.fit(TinyGPT(tiny_config()), dm, ckpt_path=ckpt)


@pytest.mark.parametrize(
    ("loader", "layout", "data"),
    [
        ({"num_workers": 0}, "padded", "mds"),
        ({"num_workers": 2}, "packed", "mds"),
        ({"num_workers": 2, "persistent_workers": True}, "padded", "mds"),
        ({"num_workers": 2, "format": "wds"}, "packed", "wds"),
    ],
    ids=["workers0", "workers2", "persistent2", "wds-workers2"],
    indirect=["data"],
)
def test_resume_equals_uninterrupted(
    data: Path, tmp_path: Path, loader: dict[str, Any], layout: str
) -> None:
    full = tmp_path / "full"
    dm = datamodule(data, layout=layout, **loader)
    n_packs = 300 // PACK  # 300 records, world size 1
    steps = (5, n_packs, n_packs + 3)  # mid-epoch, epoch end, into the next epoch
    fit(full, dm, save_at=steps)
    log = pack_log(full)
    assert len(dm.train_dataloader()) == n_packs
    # Every record at most once per epoch, every epoch the same pack count.
    for epoch in range(EPOCHS):
        ids = [i for s, e, pack in packs_by_step(log) if e == epoch for i in pack]
        assert len(ids) == n_packs * PACK
        assert len(set(ids)) == len(ids)
    assert [e for _, e, _ in packs_by_step(log)] == [0] * n_packs + [1] * n_packs
    # Two epochs differ in order (new shuffle per epoch).
    assert packs_by_step(log)[0][2] != packs_by_step(log)[n_packs][2]

    for step in steps:
        resumed = tmp_path / f"resumed{step}"
        fit(
            resumed,
            datamodule(data, layout=layout, **loader),
            ckpt=full / "ckpt" / f"step={step}.ckpt",
        )
        assert packs_by_step(pack_log(resumed)) == tail_from(log, step), f"resume at step {step}"
