"""Trainer resume: the packs after a resume equal the packs of the uninterrupted run, exactly.

Lightning saves the loader's ``state_dict()`` (and the DataModule's) in the checkpoint and
calls ``load_state_dict`` before ``iter()``; nothing here calls them by hand. Resumed runs
start in a fresh Trainer from a checkpoint mid-epoch, at the epoch end and inside the next
epoch, and must train on the same (step, epoch, record ids) as the uninterrupted run from
that step on (``resume_harness.check_resumed_runs``).

- Through ``BCLDataModule`` and TinyGPT: workers 0 and 2, persistent workers, both collate
  layouts, MDS and WebDataset; every epoch also holds every record at most once.
- A bare ``PackLoader`` returned by a plain ``LightningDataModule`` (rank 1 of 2, records as
  dicts, no collate), stopped by ``max_steps`` and resumed from ``ModelCheckpoint``'s
  ``last.ckpt``: the loader alone carries the cursor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning_scripts.harness import make_trainer, pack_log, packs_by_step, tiny_config
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_runs, resume_positions

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.loading.loader import PackLoader
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT
from tests.trainers import cpu_trainer

pytestmark = pytest.mark.slow

PACK = 8
EPOCHS = 2


@pytest.fixture
def data(request: pytest.FixtureRequest, mds_dir: Path) -> Path:
    """The MDS dataset, or the WebDataset one when the test case asks for ``format=wds``."""
    fmt = getattr(request, "param", "mds")
    return request.getfixturevalue("wds_dir") if fmt == "wds" else mds_dir


def datamodule(root: Path, layout: str, **kwargs: Any) -> BCLDataModule:
    """B=PACK, W=4, batches in ``layout``; ``kwargs`` more DataModule arguments."""
    plan = {"pack_size": PACK, "window": 4}
    return BCLDataModule(str(root), plan=plan, seed=3, batch={"collate": layout}, **kwargs)


ADOPTED = {"canonical_ranks": 1, "canonical_grad_accum": 1}
"""Canonical ranks with the node size left to the cursor (it records the physical one)."""


def fit(workdir: Path, dm: BCLDataModule, ckpt: Path | None = None, **kwargs: Any) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(workdir, max_epochs=EPOCHS, **kwargs)
    trainer.fit(TinyGPT(tiny_config()), dm, ckpt_path=ckpt)


@pytest.mark.parametrize(
    ("args", "layout", "data"),
    [
        ({"loader": {"num_workers": 0}}, "padded", "mds"),
        ({"loader": {"num_workers": 2}}, "packed", "mds"),
        ({"loader": {"num_workers": 2, "persistent_workers": True}}, "padded", "mds"),
        ({"loader": {"num_workers": 2}, "format": "wds"}, "packed", "wds"),
        # canonical_ranks_per_node unpinned: the resume adopts the saved node size, which
        # swaps the loader's reader while the persistent workers hold the one set up
        (
            {"loader": {"num_workers": 2, "persistent_workers": True}, "elastic": ADOPTED},
            "packed",
            "mds",
        ),
    ],
    ids=["workers0", "workers2", "persistent2", "wds-workers2", "persistent2-adopted"],
    indirect=["data"],
)
def test_datamodule_resume_equals_uninterrupted(
    data: Path, tmp_path: Path, args: dict[str, Any], layout: str
) -> None:
    full = tmp_path / "full"
    dm = datamodule(data, layout, **args)
    n_packs = 300 // PACK  # 300 records, world size 1
    steps = resume_positions(n_packs, mid=5)
    fit(full, dm, save_at=steps)
    log = packs_by_step(pack_log(full))
    assert len(dm.train_dataloader()) == n_packs
    # Every record at most once per epoch, every epoch the same pack count.
    for epoch in range(EPOCHS):
        ids = [pack for _, e, pack in log if e == epoch]
        check_every_record_once(ids, what=f"epoch {epoch}")
        assert sum(map(len, ids)) == n_packs * PACK
    assert [e for _, e, _ in log] == [0] * n_packs + [1] * n_packs
    # Two epochs differ in order (new shuffle per epoch).
    assert log[0][2] != log[n_packs][2]

    def resume(step: int) -> list[tuple[int, int, list[int]]]:
        resumed = tmp_path / f"resumed{step}"
        dm = datamodule(data, layout, **args)
        fit(resumed, dm, ckpt=full / "ckpt" / f"step={step}.ckpt")
        return packs_by_step(pack_log(resumed))

    check_resumed_runs(log, resume, steps)


CONFIG = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=6)
_DATASETS: dict[Path, MDSPackDataset] = {}


class Recorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: list[dict[str, Any]], index: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, [int(s["sample_id"]) for s in batch]))
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def __init__(self, root: Path, workers: int) -> None:
        super().__init__()
        self.root, self.workers = root, workers

    def train_dataloader(self) -> PackLoader:
        if self.root not in _DATASETS:  # one StreamingDataset per process, as in a real job
            _DATASETS[self.root] = MDSPackDataset(self.root, CONFIG, 1)
        return PackLoader(_DATASETS[self.root], num_workers=self.workers)  # from epoch 0


def fit_loader(root: Path, workers: int, **kwargs: Any) -> list[tuple[int, list[int]]]:
    ckpt = kwargs.pop("ckpt_path", None)
    trainer = cpu_trainer(max_epochs=EPOCHS, enable_checkpointing="callbacks" in kwargs, **kwargs)
    model = Recorder()
    trainer.fit(model, Data(root, workers), ckpt_path=ckpt)
    return model.seen


@pytest.mark.parametrize(("workers", "stop_after"), [(0, 5), (0, -1), (2, 0)])
def test_a_pack_loader_alone_resumes_under_lightning(
    workers: int, stop_after: int, mds_dir: Path, tmp_path: Path
) -> None:
    """Mid-epoch, on the last pack of an epoch (the loader's iterator not yet exhausted) and
    at the epoch end."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    reference = fit_loader(mds_dir, 0)
    per_epoch = len(reference) // EPOCHS
    k = per_epoch + stop_after if stop_after <= 0 else stop_after  # 0: the epoch end

    def resume(k: int) -> list[tuple[int, list[int]]]:
        checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=k)
        first = fit_loader(mds_dir, workers, max_steps=k, callbacks=[checkpoint])
        assert first == reference[:k], "the stopped run itself differs"
        return fit_loader(mds_dir, workers, ckpt_path=str(tmp_path / "last.ckpt"))

    check_resumed_runs(reference, resume, [k])
