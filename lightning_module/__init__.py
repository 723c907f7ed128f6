"""Lightning integration for bcl-stream: DataModule, collate, TinyGPT, HFCausalLM, CLI entry,
callbacks.

``BCLDataModule`` and ``PackLogger`` are the public pieces; ``python -m lightning_module fit
--config configs/cpu_demo.yaml`` is the command line. The names below load on first use
(PEP 562): importing the package itself imports neither Lightning nor torch, so
``python -m lightning_module`` can refuse a usage error (a dataset path that does not exist)
in a fraction of a second, before the seconds Lightning and torch take to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads them
    from bcl_stream import PackCollate
    from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once
    from lightning_module.callbacks import PackLogger, PackLogWriter, read_pack_log
    from lightning_module.datamodule import BCLDataModule
    from lightning_module.hf_causal_lm import HFCausalLM
    from lightning_module.parallel import parallelize
    from lightning_module.trainer_layout import TrainerLayout
    from lightning_module.trainer_loader import TrainerPackLoader

_EXPORTS = {
    "BCLDataModule": "lightning_module.datamodule",
    "HFCausalLM": "lightning_module.hf_causal_lm",
    "PackCollate": "bcl_stream",
    "TrainerLayout": "lightning_module.trainer_layout",
    "TrainerPackLoader": "lightning_module.trainer_loader",
    "PackLogWriter": "lightning_module.callbacks",
    "PackLogger": "lightning_module.callbacks",
    "read_pack_log": "lightning_module.callbacks",
    "clean_stale_shared_memory_once": "bcl_stream.io.streaming_compat",
    "parallelize": "lightning_module.parallel",
}

__all__ = [
    "BCLDataModule",
    "HFCausalLM",
    "PackCollate",
    "PackLogWriter",
    "PackLogger",
    "TrainerLayout",
    "TrainerPackLoader",
    "clean_stale_shared_memory_once",
    "parallelize",
    "read_pack_log",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_module' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
