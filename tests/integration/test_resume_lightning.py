"""Real Lightning (single CPU device): a run stopped by a checkpoint after k packs and resumed
from it trains on exactly the packs of the uninterrupted run, mid-epoch, on the last pack of
an epoch and at the epoch end. Lightning saves ``PackLoader.state_dict()`` and calls
``load_state_dict`` before ``iter()``; nothing here calls them by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow

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


def fit(root: Path, workers: int, **kwargs: Any) -> list[tuple[int, list[int]]]:
    ckpt = kwargs.pop("ckpt_path", None)
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing="callbacks" in kwargs,
        accelerator="cpu",
        devices=1,
        **kwargs,
    )
    model = Recorder()
    trainer.fit(model, Data(root, workers), ckpt_path=ckpt)
    return model.seen


@pytest.mark.parametrize(("workers", "stop_after"), [(0, 5), (0, -1), (2, 0)])
def test_lightning_resume_equals_uninterrupted(
    workers: int, stop_after: int, mds_dir: Path, tmp_path: Path
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    reference = fit(mds_dir, 0)
    per_epoch = len(reference) // 2
    k = per_epoch + stop_after if stop_after <= 0 else stop_after  # 0: the epoch end
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=k)
    first = fit(mds_dir, workers, max_steps=k, callbacks=[checkpoint])
    assert len(first) == k
    resumed = fit(mds_dir, workers, ckpt_path=str(tmp_path / "last.ckpt"))
    assert first + resumed == reference
