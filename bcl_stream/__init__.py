"""bcl-stream: Batch Cost Lookahead for synchronous distributed training on variable-length data.

This module is the public face: import what you use from here (``from bcl_stream import
open_dataset, PackLoader, ReaderConfig``). The modules behind it may move; these names stay.

- reading: :func:`open_dataset` (one dataset or a mixture), :class:`MDSPackDataset`,
  :class:`WDSPackDataset`, :class:`MixturePackDataset`, :class:`PackLoader` (the loader that
  owns the resume cursor), :class:`ReaderConfig` and its planner part :class:`PlanConfig`,
  :class:`ReadOptions`, :class:`RecordSource`, :class:`StreamSpec`;
- batches: :class:`PackCollate` (padded or packed), :class:`ImageCollate` (image-text records:
  the model's ``pixel_values``, ``image_grid_thw``);
- writing: :class:`CostedMDSWriter`, :class:`CostedWDSWriter`;
- cost models: :class:`CostModel`, :func:`get_preset`, :func:`preset_names`;
- errors: :class:`BCLStreamError` and its subclasses.

The import is light (PEP 562): ``import bcl_stream`` loads none of the modules behind the
names; each loads on first use, so the planner, cost models and simulator never pull torch,
streaming or webdataset, and a reader or writer pulls what it needs when first named.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bcl_stream.cost import CostModel, get_preset, preset_names
    from bcl_stream.epoch.mixture_index import StreamSpec
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.errors import (
        BCLStreamError,
        CostIndexError,
        DatasetError,
        PlanError,
        RemoteAccessError,
        StateError,
    )
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.formats.mds_writer import CostedMDSWriter
    from bcl_stream.formats.mixture_reader import MixturePackDataset
    from bcl_stream.formats.open_dataset import open_dataset
    from bcl_stream.formats.read_options import ReadOptions
    from bcl_stream.formats.wds_reader import WDSPackDataset
    from bcl_stream.formats.wds_writer import CostedWDSWriter
    from bcl_stream.io.streaming_compat import UnsupportedLibraryError
    from bcl_stream.loading.collate import PackCollate
    from bcl_stream.loading.loader import PackLoader
    from bcl_stream.planner.config import PlanConfig
    from bcl_stream.records.source import RecordSource
    from bcl_stream.vision.batch import ImageCollate

_HOMES: dict[str, str] = {
    "BCLStreamError": "bcl_stream.errors",
    "CostIndexError": "bcl_stream.errors",
    "CostModel": "bcl_stream.cost",
    "CostedMDSWriter": "bcl_stream.formats.mds_writer",
    "CostedWDSWriter": "bcl_stream.formats.wds_writer",
    "DatasetError": "bcl_stream.errors",
    "ImageCollate": "bcl_stream.vision.batch",
    "MDSPackDataset": "bcl_stream.formats.mds_reader",
    "MixturePackDataset": "bcl_stream.formats.mixture_reader",
    "PackCollate": "bcl_stream.loading.collate",
    "PackLoader": "bcl_stream.loading.loader",
    "PlanConfig": "bcl_stream.planner.config",
    "PlanError": "bcl_stream.errors",
    "ReadOptions": "bcl_stream.formats.read_options",
    "ReaderConfig": "bcl_stream.epoch.plan",
    "RemoteAccessError": "bcl_stream.errors",
    "StateError": "bcl_stream.errors",
    "StreamSpec": "bcl_stream.epoch.mixture_index",
    "RecordSource": "bcl_stream.records.source",
    "UnsupportedLibraryError": "bcl_stream.io.streaming_compat",
    "WDSPackDataset": "bcl_stream.formats.wds_reader",
    "get_preset": "bcl_stream.cost",
    "open_dataset": "bcl_stream.formats.open_dataset",
    "preset_names": "bcl_stream.cost",
}
"""Each public name and the module that defines it (imported on first use)."""

__all__ = [
    "BCLStreamError",
    "CostIndexError",
    "CostModel",
    "CostedMDSWriter",
    "CostedWDSWriter",
    "DatasetError",
    "ImageCollate",
    "MDSPackDataset",
    "MixturePackDataset",
    "PackCollate",
    "PackLoader",
    "PlanConfig",
    "PlanError",
    "ReadOptions",
    "ReaderConfig",
    "RecordSource",
    "RemoteAccessError",
    "StateError",
    "StreamSpec",
    "UnsupportedLibraryError",
    "WDSPackDataset",
    "get_preset",
    "open_dataset",
    "preset_names",
]
"""The public names (the keys of ``_HOMES``; a test checks the two agree)."""

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported from its home the first time it is asked for (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
