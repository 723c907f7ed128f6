"""Validation and test loaders of :class:`~lightning_module.datamodule.BCLDataModule`.

A mixin, so the DataModule's file keeps to training: the evaluation readers and their plan are
in the core (``bcl_stream.loading.evaluation``, ``bcl_stream.epoch.eval_plan``: every record
once across ranks, equal pack counts, packs of at most B); this wires them to the trainer's
layout and the DataModule's collate. Lightning calls ``val_dataloader`` / ``test_dataloader``
after ``setup``; without validation (test) data they return no loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from bcl_stream.loading.evaluation import evaluation_dataset, evaluation_loader

if TYPE_CHECKING:
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.read_options import ReadOptions
    from bcl_stream.formats.reader_base import PlanDataset
    from bcl_stream.loading.collate import PackCollate


class EvaluationLoaders:
    """``val_dataloader`` / ``test_dataloader`` for a DataModule that has ``evaluation``
    (kind -> dataset locations), ``eval_packing``, ``options``, ``cache_dir``, ``num_workers``,
    ``layout_used`` (set by its ``setup``), ``reader_config(layout)`` and ``collate_for``."""

    evaluation: dict[str, list[str]]
    eval_packing: str
    options: ReadOptions
    cache_dir: str | None
    num_workers: int
    layout_used: Any
    _eval_loaders: dict[str, list[DataLoader[Any]]]

    if TYPE_CHECKING:  # the DataModule's own, which this mixin calls

        def reader_config(self, layout: Any) -> ReaderConfig: ...

        def collate_for(self, dataset: PlanDataset) -> PackCollate: ...

        def _require_dataset(self) -> PlanDataset: ...

    def val_dataloader(self) -> list[DataLoader[Any]]:
        """One loader of every validation record, once across ranks (``val_data``: one;
        ``val_streams``: one per stream); none without validation data."""
        return self._evaluation_loaders("val")

    def test_dataloader(self) -> list[DataLoader[Any]]:
        """One loader of every test record, once across ranks (see :meth:`val_dataloader`)."""
        return self._evaluation_loaders("test")

    def _evaluation_loaders(self, kind: str) -> list[DataLoader[Any]]:
        """Built once per DataModule and kind, after setup (the trainer's layout decides the
        packs; ``bcl_stream.loading.evaluation``)."""
        if kind not in self._eval_loaders:
            self._require_dataset()
            assert self.layout_used is not None
            from lightning_module.datamodule import _explain_len_warning

            _explain_len_warning()  # exact here too: worker w of K reads packs w, w+K, ...
            config = self.reader_config(self.layout_used)
            loaders = []
            for i, location in enumerate(self.evaluation[kind]):
                dataset = evaluation_dataset(
                    location,
                    config,
                    self.layout_used.rank,
                    packing=self.eval_packing,
                    cache_dir=None if self.cache_dir is None else f"{self.cache_dir}/{kind}-{i}",
                    options=self.options,
                )
                collate = self.collate_for(dataset)
                loaders.append(
                    evaluation_loader(dataset, collate_fn=collate, num_workers=self.num_workers)
                )
            self._eval_loaders[kind] = loaders
        return self._eval_loaders[kind]
