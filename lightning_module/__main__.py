"""``python -m lightning_module fit --config configs/cpu_demo.yaml``: LightningCLI entry.

Model: any ``LightningModule`` (``--model pkg.module.Class`` or ``model.class_path``; the
configs name ``lightning_module.tinygpt.TinyGPT``). It receives the batch dicts described in
docs/lightning.md ("The batch"). Data: :class:`~lightning_module.datamodule.BCLDataModule`.

Before the CLI builds anything, the launching process removes shared memory a killed streaming
job may have left behind (streaming names its shared memory by rank and refuses to reuse a
stale one). Lightning's ``ddp`` launcher re-runs this module in each extra rank with
``LOCAL_RANK`` set; those skip the cleanup.

Errors of ours (:class:`~bcl_stream.errors.BCLStreamError`: bad data, a plan with no pack, a
checkpoint that does not fit) print as one line and exit 2; ``BCL_STREAM_DEBUG=1`` shows the
traceback with its causes instead.
"""

from __future__ import annotations

import os
import sys
import traceback

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

from bcl_stream.errors import BCLStreamError
from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once
from lightning_module.datamodule import BCLDataModule

PROG = "python -m lightning_module"


def main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI (``args`` instead of ``sys.argv`` for tests)."""
    clean_stale_shared_memory_once()
    return LightningCLI(
        pl.LightningModule,
        BCLDataModule,
        subclass_mode_model=True,
        args=args,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": PROG},
    )


def run() -> int:
    """:func:`main` with our errors as one line on stderr (exit 2)."""
    try:
        main()
    except BCLStreamError as exc:
        if os.environ.get("BCL_STREAM_DEBUG") == "1":
            traceback.print_exception(exc)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run())
