"""``python -m lightning_module fit --config configs/cpu_demo.yaml``: LightningCLI entry.

Model: ``TinyGPT`` by default (``--model`` / ``model.class_path`` takes any LightningModule);
data: :class:`~lightning_module.datamodule.BCLDataModule`. Before the CLI builds anything, the
launching process removes shared memory a killed streaming job may have left behind (streaming
names its shared memory by rank and refuses to reuse a stale one). Lightning's ``ddp``
launcher re-runs this module in each extra rank with ``LOCAL_RANK`` set; those skip the cleanup.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from lightning_module.datamodule import BCLDataModule, clean_stale_shared_memory_once
from lightning_module.tinygpt import TinyGPT


def main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI (``args`` instead of ``sys.argv`` for tests)."""
    clean_stale_shared_memory_once()
    return LightningCLI(
        TinyGPT,
        BCLDataModule,
        subclass_mode_model=True,
        args=args,
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    main()
