"""Validation and test loaders: every record of a dataset once across ranks, equal pack counts,
no resume state (``epoch/eval_plan.py`` says why and how the packs are cut).

A plain torch ``DataLoader`` over the reader (not :class:`~bcl_stream.loading.loader.PackLoader`):
an evaluation pass has no cursor to save (Lightning restarts it from its first batch), and its
``len()`` is the plan's packs per rank, exact for any number of workers (worker w of K reads
packs w, w+K, ...; torch's round-robin restores the order).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader

from bcl_stream.epoch.eval_plan import EVAL_PACKINGS
from bcl_stream.epoch.mixture_index import StreamSpec
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import Pack, PlanDataset


def evaluation_dataset(
    location: str,
    config: ReaderConfig,
    rank: int,
    *,
    packing: str = "sequential",
    cache_dir: str | os.PathLike[str] | None = None,
    options: ReadOptions | None = None,
) -> PlanDataset:
    """The reader of ``location`` (its own format) for one evaluation pass of rank ``rank``:
    ``config`` gives the world size, B, the cost model and the token source (the evaluation
    data's own index decides the source when ``config.tokens`` is None)."""
    if packing not in EVAL_PACKINGS:
        raise ValueError(f"evaluation packing must be one of {EVAL_PACKINGS}, got {packing!r}")
    plain = replace(config, plan=replace(config.plan, scope="rank"))  # any format reads it
    return open_reader(location, plain, rank, cache_dir, options).for_evaluation(packing)


def evaluation_loader(
    dataset: PlanDataset,
    *,
    collate_fn: Callable[[Pack], Any],
    num_workers: int = 0,
) -> DataLoader[Any]:
    """A loader of one evaluation pass over ``dataset`` (:func:`evaluation_dataset`)."""
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=collate_fn)


def evaluation_sources(kind: str, data: str | None, streams: list[Any] | None) -> list[str]:
    """The datasets of ``{kind}_data`` (one) or ``{kind}_streams`` (each stream's path, read
    whole: weights do not apply to an evaluation pass)."""
    if data is not None and streams is not None:
        raise ValueError(f"give {kind}_data or {kind}_streams, not both")
    if streams is None:
        return [] if data is None else [data]
    if not isinstance(streams, list | tuple) or not streams:
        raise ValueError(f"{kind}_streams must be a non-empty list, got {streams!r}")
    return [StreamSpec.of(x).path for x in streams]
