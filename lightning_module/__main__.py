"""``python -m lightning_module fit --config configs/cpu_demo.yaml``: LightningCLI entry.

Model: any ``LightningModule`` (``--model pkg.module.Class`` or ``model.class_path``; the
configs name ``lightning_module.tinygpt.TinyGPT``). It receives the batch dicts described in
docs/lightning.md ("The batch"). Data: :class:`~lightning_module.datamodule.BCLDataModule`.

Before the CLI builds anything, the launching process removes shared memory a killed streaming
job may have left behind (streaming names its shared memory by rank and refuses to reuse a
stale one). Lightning's ``ddp`` launcher re-runs this module in each extra rank with
``LOCAL_RANK`` set; those skip the cleanup.

Errors of ours (:class:`~bcl_stream.errors.BCLStreamError`: bad data, a plan with no pack, a
checkpoint that does not fit, a flat ``data`` key instead of its grouped one) print as one line
and exit 2. ``--debug`` before the subcommand
(``python -m lightning_module --debug fit ...``) or ``BCL_STREAM_DEBUG=1`` prints the traceback
with its chain of causes before that line, as ``bcl-stream --debug`` does. ``--debug`` is taken
off the arguments before LightningCLI parses them (it has no such option) and exported as
``BCL_STREAM_DEBUG=1``, so the ranks Lightning's ``ddp`` launcher starts report the same way.

Paths: relative paths in a config file resolve against the config's root (``--root DIR``,
``$BCL_STREAM_ROOT``, the config's ``root:`` key or the file's directory:
:mod:`lightning_module.config_paths`), not the current directory; one callback's argument is
set with ``--trainer.callbacks.N.KEY VALUE`` (:mod:`lightning_module.cli`).
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import TYPE_CHECKING

from bcl_stream.errors import DEBUG_ENV, BCLStreamError, report
from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once
from lightning_module.cli_checks import check_paths, given_data_keys
from lightning_module.config_paths import resolve_config_paths

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI

PROG = "python -m lightning_module"


def main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI (``args`` instead of ``sys.argv`` for tests; their config paths resolved
    as :func:`run` resolves them). Lightning and torch are imported here, after
    :func:`~lightning_module.cli_checks.check_paths` (seconds)."""
    import lightning.pytorch as pl

    from lightning_module.cli import BCLCLI
    from lightning_module.datamodule import BCLDataModule
    from lightning_module.options import refuse_flat

    taken = set(inspect.signature(BCLDataModule.__init__).parameters)
    given = given_data_keys(sys.argv[1:] if args is None else args)
    refuse_flat({key: None for key in sorted(given - taken)})  # one line, not the usage text
    clean_stale_shared_memory_once()
    return BCLCLI(
        pl.LightningModule,
        BCLDataModule,
        subclass_mode_model=True,
        args=None if args is None else resolve_config_paths(args),
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": PROG},
    )


def run(argv: list[str] | None = None) -> int:
    """:func:`main` with our errors as one line on stderr (exit 2); leading ``--debug`` flags
    are ours (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = False
    while args and args[0] == "--debug":
        args.pop(0)
        debug = True
    if debug:
        os.environ[DEBUG_ENV] = "1"  # inherited by the ranks the ddp launcher starts
    args = resolve_config_paths(args)  # the configs' relative paths made absolute
    if argv is None:
        sys.argv[1:] = args  # LightningCLI and the ddp launcher read sys.argv, not ours
    try:
        check_paths(args)  # before the imports of Lightning and torch (seconds)
        main(None if argv is None else args)
    except BCLStreamError as exc:
        return report(PROG, exc)
    return 0


if __name__ == "__main__":
    sys.exit(run())
