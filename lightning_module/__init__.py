"""Lightning integration for bcl-stream: DataModule, collate, TinyGPT, CLI entry, callbacks.

``BCLDataModule`` and ``PackLogger`` are the public pieces; ``python -m lightning_module fit
--config configs/cpu_demo.yaml`` is the command line. Importing this package imports
Lightning and torch (not streaming: the readers load when a dataset is built).
"""

from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once
from lightning_module.callbacks import PackLogger, PackLogWriter, read_pack_log
from lightning_module.datamodule import (
    BCLDataModule,
    PackCollate,
    TrainerPackLoader,
)

__all__ = [
    "BCLDataModule",
    "PackCollate",
    "PackLogWriter",
    "PackLogger",
    "TrainerPackLoader",
    "clean_stale_shared_memory_once",
    "read_pack_log",
]
