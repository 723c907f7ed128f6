"""One epoch of BCL packs on 4 CPU processes (gloo) as 2 data-parallel x 2 tensor-parallel
under Lightning's ``ModelParallelStrategy``, with Fabric or with the Trainer; TinyGPT with real
tensor parallelism on its MLPs and FSDP2 across data-parallel ranks
(``lightning_module.parallel``).

Usage: ``python mesh_fit.py fabric|trainer DATA OUT [CKPT]`` (the Trainer saves a checkpoint
after step 7 in ``OUT/ckpt/step=7.ckpt``; CKPT: resume from one). Lightning launches the
other 3 processes by re-running this script. Each process g writes ``OUT/logs/packs_rank{g}.jsonl``
(the PackLogger format) and ``OUT/process{g}.json``: its TrainerLayout, the environment Mosaic
Streaming read, the plan's world size and its loss per step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch

from lightning_module.callbacks import PackLogWriter
from lightning_module.datamodule import BCLDataModule
from lightning_module.parallel import parallelize
from lightning_module.tinygpt import TinyGPT
from lightning_scripts.harness import make_trainer, tiny_config

PACK, WINDOW, SEED, DP, TP = 8, 4, 5, 2, 2
SAVE_AT = 7
DATAMODULE: dict[str, Any] = {
    "plan": {"pack_size": PACK, "window": WINDOW, "scope": "node"}, "seed": SEED,
    "batch": {"collate": "packed", "max_seq_len": 128}, "loader": {"num_workers": 1},
}  # fmt: skip


def streaming_env() -> dict[str, str | None]:
    """What Mosaic Streaming reads (Lightning removes WORLD_SIZE again at teardown)."""
    return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}


def write_process(
    out: Path, rank: int, dm: BCLDataModule, env: dict[str, str | None], losses: list[float]
) -> None:
    layout = dm.layout_used
    assert layout is not None and dm.dataset is not None
    (out / f"process{rank}.json").write_text(
        json.dumps(
            {
                "layout": {
                    "rank": layout.process.rank,
                    "world_size": layout.process.world_size,
                    "ranks_per_node": layout.process.ranks_per_node,
                    "group_size": layout.process.group_size,
                    "local_processes": layout.process.local_processes,
                },
                "streaming_env": env,
                "plan": {
                    "world_size": dm.dataset.config.plan.world_size,
                    "ranks_per_node": dm.dataset.config.plan.ranks_per_node,
                },
                "losses": losses,
            }
        )
    )


def run_fabric(data: str, out: Path) -> None:
    from lightning.fabric.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(
        parallelize_fn=parallelize, data_parallel_size=DP, tensor_parallel_size=TP
    )
    fabric = L.Fabric(accelerator="cpu", devices=DP * TP, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    dm = BCLDataModule(data, **DATAMODULE)
    dm.setup_fabric(fabric)
    env = streaming_env()
    model = fabric.setup_module(TinyGPT(tiny_config()))
    model.mark_forward_method("loss")
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    log = PackLogWriter(out / "logs", fabric.global_rank, fresh=True)
    losses = []
    for i, batch in enumerate(dm.train_dataloader()):
        loss = model.loss(batch)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        log.write(step=i, epoch=0, batch_idx=i, batch=batch, step_seconds=0.0, forward_seconds=0.0)
    log.close()
    write_process(out, fabric.global_rank, dm, env, losses)


class Losses(pl.Callback):
    """The loss of every training batch of this process, and the streaming environment."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.env: dict[str, str | None] = {}

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.env = streaming_env()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
        self.values.append(float(outputs["loss"].detach()))


def run_trainer(data: str, out: Path, resume: str | None = None) -> None:
    """A distributed checkpoint after step ``SAVE_AT`` in ``out/ckpt``; ``resume``: a
    checkpoint to resume from."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    losses = Losses()
    # No seed: the processes initialise TinyGPT differently, and parallelize() must still
    # give a tensor-parallel group one model (the losses of a group are compared).
    trainer = make_trainer(
        out,
        max_epochs=1,
        devices=DP * TP,
        strategy=ModelParallelStrategy(data_parallel_size=DP, tensor_parallel_size=TP),
        callbacks=[losses],
        save_at=(SAVE_AT,),
    )
    dm = BCLDataModule(data, **DATAMODULE)
    trainer.fit(TinyGPT(tiny_config()), dm, ckpt_path=resume)
    write_process(out, trainer.global_rank, dm, losses.env, losses.values)


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, data, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "fabric":
        run_fabric(data, out)
    else:
        run_trainer(data, out, sys.argv[4] if len(sys.argv) > 4 else None)
