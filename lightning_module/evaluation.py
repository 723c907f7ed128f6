"""Validation and test loaders of :class:`~lightning_module.datamodule.BCLDataModule`.

:class:`Evaluation` is an object the DataModule builds from what it needs and nothing else
(the datasets, the packing, the read options, the cache directory, the workers and the
collate); the DataModule's ``val_dataloader`` / ``test_dataloader`` hand it the reader
configuration under the trainer's layout. The readers and their plan are in the core
(``bcl_stream.loading.evaluation``, ``bcl_stream.epoch.eval_plan``: every record once across
ranks, equal pack counts, packs of at most B); this wires them to Lightning.

Without validation (test) data the DataModule offers no ``val_dataloader``
(``test_dataloader``) hook at all (:class:`EvaluationHook`). Returning an empty list instead,
as this module once did, made Lightning's evaluation loop flatten ``[]`` into one "loader" of
length zero and print "Total length of `list` across ranks is zero" on every run; a hook that
is not there is Lightning's own way of saying "no validation", so the loop is skipped. (A
model that defines ``validation_step``, as TinyGPT does, still gets Lightning's one line "You
defined a `validation_step` but have no `val_dataloader`. Skipping val loop.": which is so.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from bcl_stream import PlanDataset, ReaderConfig, ReadOptions
from bcl_stream.loading.evaluation import evaluation_dataset, evaluation_loader
from bcl_stream.training import EVAL_PACKINGS, Collate
from lightning_module.trainer_loader import explain_len_warning

KINDS = ("val", "test")


@dataclass
class Evaluation:
    """The validation and test passes: one loader per dataset of each kind, built once (the
    trainer's layout decides the packs, so the first call after set-up builds them)."""

    sources: dict[str, list[str]]
    """Kind (``val``, ``test``) -> dataset locations (``bcl_stream.loading.evaluation``)."""
    packing: str
    """``sequential`` (write order) or ``bcl`` (packs of similar cost, balanced steps)."""
    options: ReadOptions
    cache_dir: str | None
    """The DataModule's cache; each evaluation dataset gets its own ``{kind}-{i}`` below it."""
    num_workers: int
    collate_for: Callable[[PlanDataset], Collate]
    """The collate of a reader (each evaluation dataset has its own index)."""
    _loaders: dict[str, list[DataLoader[Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.packing not in EVAL_PACKINGS:
            raise ValueError(f"eval packing must be one of {EVAL_PACKINGS}, got {self.packing!r}")
        unknown = sorted(set(self.sources) - set(KINDS))
        if unknown:
            raise ValueError(f"evaluation kinds are {KINDS}, got {unknown}")

    def has(self, kind: str) -> bool:
        """Whether there is data of ``kind`` to evaluate."""
        return bool(self.sources.get(kind))

    def loaders(self, kind: str, config: ReaderConfig, rank: int) -> list[DataLoader[Any]]:
        """One loader of every ``kind`` record, once across ranks, for ``rank`` under
        ``config`` (the training reader's configuration: world size, B, cost model)."""
        if kind not in self._loaders:
            explain_len_warning()  # exact here too: worker w of K reads packs w, w+K, ...
            loaders = []
            for i, location in enumerate(self.sources.get(kind, [])):
                dataset = evaluation_dataset(
                    location,
                    config,
                    rank,
                    packing=self.packing,
                    cache_dir=None if self.cache_dir is None else f"{self.cache_dir}/{kind}-{i}",
                    options=self.options,
                )
                collate = self.collate_for(dataset)
                loaders.append(
                    evaluation_loader(dataset, collate_fn=collate, num_workers=self.num_workers)
                )
            self._loaders[kind] = loaders
        return self._loaders[kind]


class EvaluationHook:
    """A DataModule's ``val_dataloader`` / ``test_dataloader``, present only where the module
    has data of that kind (see the module docstring).

    Lightning decides whether a DataModule has a hook by comparing it with
    ``LightningDataModule``'s own (``is_overridden``): where there is no data this returns
    Lightning's own method, so Lightning skips the loop (and ``trainer.validate`` says there is
    no ``val_dataloader``); otherwise the module's ``evaluation_loaders`` for the kind. A descriptor,
    not an attribute set per instance, so a pickled DataModule (``ddp_spawn``) keeps it.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"{kind}_dataloader"

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        if not module.evaluation.has(self.kind):
            hook = getattr(pl.LightningDataModule, self.name)
            return hook.__get__(module, owner)
        return partial(module.evaluation_loaders, self.kind)
