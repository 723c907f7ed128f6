"""Shared by the Lightning/Fabric/DDP tests and their subprocess scripts: a tiny TinyGPT, a
Trainer factory, and the pack logs as (step, epoch, record ids) per step, which the tests
compare through ``tests/resume_harness.py`` (resumed output == uninterrupted output).

Kept free of pytest so subprocess scripts can import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_module.callbacks import PackLogger, read_pack_log
from lightning_module.tinygpt import TinyGPTConfig
from tests.trainers import QUIET, cpu_trainer

# One thread per process: the test machine has 2 cores shared by several jobs, and torch's
# default (all cores) makes a tiny step 50x slower under contention (measured 8 ms vs 0.5 s).
torch.set_num_threads(1)


def tiny_config() -> TinyGPTConfig:
    """A TinyGPT small enough for a step in milliseconds on one CPU core."""
    return TinyGPTConfig(
        vocab_size=256, d_model=16, n_layers=1, n_heads=2, ffn_hidden=32, max_seq_len=128
    )


class SaveAtSteps(pl.Callback):
    """Save ``dirpath/step={n}.ckpt`` after the batch that completes step n, for n in ``steps``
    (the same ``trainer.save_checkpoint`` call ModelCheckpoint makes, without saving every step).
    """

    def __init__(self, dirpath: Path, steps: Sequence[int]) -> None:
        self.dirpath, self.steps = Path(dirpath), set(steps)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step in self.steps:
            trainer.save_checkpoint(self.dirpath / f"step={trainer.global_step}.ckpt")


def make_trainer(
    workdir: Path,
    *,
    max_epochs: int | None = None,
    max_steps: int = -1,
    checkpoint_every: int | None = None,
    save_at: Sequence[int] = (),
    log_dir: str = "logs",
    callbacks: Sequence[pl.Callback] = (),
    **kwargs: Any,
) -> pl.Trainer:
    """A quiet CPU trainer with a PackLogger (fresh log) and optional per-step checkpoints."""
    cbs: list[pl.Callback] = [PackLogger(workdir / log_dir, fresh=True), *callbacks]
    if save_at:
        cbs.append(SaveAtSteps(workdir / "ckpt", save_at))
    if checkpoint_every is not None:
        cbs.append(
            ModelCheckpoint(
                dirpath=workdir / "ckpt",
                filename="{step}",
                every_n_train_steps=checkpoint_every,
                save_top_k=-1,
            )
        )
    return cpu_trainer(
        max_epochs=max_epochs,
        max_steps=max_steps,
        enable_checkpointing=checkpoint_every is not None,
        callbacks=cbs,
        **kwargs,
    )


def pack_log(workdir: Path, rank: int = 0, log_dir: str = "logs") -> list[dict[str, Any]]:
    return read_pack_log(workdir / log_dir / f"packs_rank{rank}.jsonl")


def packs_by_step(log: list[dict[str, Any]]) -> list[tuple[int, int, list[int]]]:
    """(step, epoch, sample_ids) per logged batch, in order."""
    return [(line["step"], line["epoch"], line["sample_ids"]) for line in log]


def cli_run_config(base: Path, tmp: Path, name: str, every: int, data: dict[str, Any]) -> Path:
    """A LightningCLI config for one test run: ``base`` (a file of configs/) with this run's
    logs and checkpoints (``{step}`` every ``every`` steps) under ``tmp/name``, the tiny model,
    and ``data`` merged into its data section (a group such as ``plan`` key by key, so a run
    changes one knob and keeps the base's others)."""
    import yaml

    cfg = yaml.safe_load(base.read_text())
    cfg["trainer"].update(
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp / name)
    )
    for cb in cfg["trainer"]["callbacks"]:
        if cb["class_path"].endswith("PackLogger"):
            cb["init_args"] = {"directory": str(tmp / name / "logs"), "fresh": True}
        else:
            cb["init_args"].update(
                dirpath=str(tmp / name / "ckpt"), filename="{step}", every_n_train_steps=every
            )
    tiny = tiny_config()
    cfg["model"]["init_args"]["config"] = {
        key: getattr(tiny, key)
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len")
    }
    for key, value in data.items():
        shipped = cfg["data"].get(key)
        both = isinstance(shipped, dict) and isinstance(value, dict)
        cfg["data"][key] = {**shipped, **value} if both else value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def lightning_cli(
    root: Path,
    *args: str,
    cwd: Path | None = None,
    path: Sequence[Path] = (),
    fresh: bool = False,
) -> Any:
    """``python -m lightning_module ARGS`` in its own process as a user launches it (launcher
    and debug variables cleared, other streaming jobs' shared memory kept; ``path`` first on
    ``PYTHONPATH``, then this checkout): forked from a pre-imported server unless ``fresh``
    (``cli_process``'s docstring; a ``ddp`` fit's other ranks are fresh processes either way,
    started by Lightning from the run's ``sys.argv`` and ``__main__.__spec__``). Returns the
    completed process, output captured."""
    from cli_process import run_module

    env = lightning_cli_env()
    return run_module(
        "lightning_module", *args, env=env, cwd=cwd or root, timeout=600, path=path, fresh=fresh
    )


def lightning_cli_env() -> dict[str, str]:
    """The environment :func:`lightning_cli` runs the CLI in."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "BCL_STREAM_KEEP_SHM": "1"}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "BCL_STREAM_DEBUG"):
        env.pop(key, None)
    return env


def lightning_cli_runs(commands: Sequence[Sequence[str]], scratch: Path) -> list[Any]:
    """Several ``python -m lightning_module ARGS`` in ONE process, the environment of
    :func:`lightning_cli` (``cli_process.runs_in_one_process``: each its own exit code,
    output and seconds; one import of Lightning and torch for all). For runs on one device:
    Lightning's ``ddp`` launcher re-runs the command line of a process."""
    from cli_process import runs_in_one_process

    entry = "lightning_module.__main__:run"
    return runs_in_one_process(entry, commands, scratch, lightning_cli_env(), timeout=1200)


def cli_fit(root: Path, config: Path, *extra: str) -> None:
    """``fit --config CONFIG EXTRA`` through :func:`lightning_cli`; it must succeed."""
    proc = lightning_cli(root, "fit", "--config", str(config), *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def tiny_fit_config(
    tmp: Path,
    data: dict[str, Any],
    *,
    trainer: dict[str, Any] | None = None,
    model: str = "lightning_module.tinygpt.TinyGPT",
    model_args: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
) -> Path:
    """``tmp/config.yaml`` for ``python -m lightning_module fit``: a quiet CPU trainer (one
    device, no checkpoints) with a PackLogger into ``tmp/logs``, ``model`` (a TinyGPT or a
    subclass) of the tiny size, and ``data`` as the DataModule's arguments; ``trainer``
    overrides trainer keys."""
    import yaml

    tiny = tiny_config()
    keys = ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len")
    sizes = {k: getattr(tiny, k) for k in keys}
    if max_seq_len is not None:
        sizes["max_seq_len"] = max_seq_len
    config = {
        "seed_everything": 0,
        "trainer": {
            **QUIET,
            "default_root_dir": str(tmp / "run"),
            "callbacks": [
                {
                    "class_path": "lightning_module.callbacks.PackLogger",
                    "init_args": {"directory": str(tmp / "logs")},
                }
            ],
            **(trainer or {}),
        },
        "model": {"class_path": model, "init_args": {"config": sizes, **(model_args or {})}},
        "data": data,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
