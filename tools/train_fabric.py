"""Train TinyGPT with Lightning Fabric on BCL packs; save and resume model, optimizer and data.

Why a Fabric example: Fabric has no fit loop that saves loader state for you. What makes the
resume exact is that ``BCLDataModule`` is one of the stateful values handed to
``fabric.save``/``fabric.load``: its ``state_dict`` is the reader cursor, loading it before
the loader is built makes the next ``iter()`` continue at the next pack of the same plan.

    python tools/train_fabric.py --data results/demo/work/mds --steps 60 --save-at 30 \\
        --workdir results/fabric
    python tools/train_fabric.py --data results/demo/work/mds --steps 60 \\
        --resume results/fabric/ckpt/step=30.ckpt --workdir results/fabric-resumed

``--devices 2`` runs 2 CPU ranks (gloo); Fabric re-launches this script for the second rank.
Per-rank pack logs (the ``PackLogger`` format) go to ``<workdir>/logs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch

from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once
from lightning_module.callbacks import PackLogWriter
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT, TinyGPTConfig


def train(
    data: str,
    workdir: str | Path,
    *,
    steps: int,
    save_at: tuple[int, ...] = (),
    resume: str | Path | None = None,
    model_config: TinyGPTConfig | None = None,
    devices: int = 1,
    num_nodes: int = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
    lr: float = 1e-3,
    seed: int = 0,
    **datamodule_kwargs: Any,
) -> dict[str, Any]:
    """Run (or resume) until ``steps`` optimizer steps; save ``ckpt/step={n}.ckpt`` at each n
    in ``save_at``. Returns the final state's step and loader cursor (rank 0's view)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    fabric = L.Fabric(
        accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy=strategy
    )
    fabric.launch()
    fabric.seed_everything(seed)
    workdir = Path(workdir)
    dm = BCLDataModule(data, seed=seed, **datamodule_kwargs)
    dm.setup_fabric(fabric)  # rank, world size and ranks per node from Fabric
    model = TinyGPT(model_config or TinyGPTConfig())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model, optimizer = fabric.setup(model, optimizer)
    model.mark_forward_method("loss")  # DDP must see the call that runs forward
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "data": dm, "step": 0}
    if resume is not None:
        fabric.load(resume, state)  # the DataModule keeps the cursor for its loader
    loader = fabric.setup_dataloaders(dm.train_dataloader(), use_distributed_sampler=False)
    packs = dm.train_dataloader()  # the PackLoader itself: epoch and cursor for the log
    log = PackLogWriter(workdir / "logs", fabric.global_rank, fresh=True)
    try:
        while state["step"] < steps:
            for batch in loader:
                start = time.perf_counter()
                loss = model.loss(batch)
                forward = time.perf_counter() - start
                fabric.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                log.write(
                    step=state["step"],
                    epoch=packs.epoch,
                    batch_idx=packs.packs_consumed - 1,  # counted as the pack arrived
                    batch=batch,
                    step_seconds=time.perf_counter() - start,
                    forward_seconds=forward,
                )
                state["step"] += 1
                if state["step"] in save_at:
                    fabric.save(workdir / "ckpt" / f"step={state['step']}.ckpt", state)
                if state["step"] >= steps:
                    break
    finally:
        log.close()
    return {"step": state["step"], "cursor": dm.state_dict()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fabric training on BCL packs with exact resume.")
    p.add_argument("--data", required=True, help="dataset root (local dir or s3://...)")
    p.add_argument("--workdir", default="results/fabric")
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps")
    p.add_argument("--save-at", type=int, nargs="*", default=[], help="steps to checkpoint at")
    p.add_argument("--resume", default=None, help="checkpoint written by --save-at")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--pack-size", type=int, default=8)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--scope", default="rank")
    p.add_argument("--packing", default="bcl", choices=["bcl", "sequential"])
    p.add_argument("--layout", default="packed", choices=["packed", "padded"])
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    clean_stale_shared_memory_once()
    config = TinyGPTConfig(vocab_size=2048, d_model=64, ffn_hidden=256, max_seq_len=1024)
    out = train(
        args.data,
        args.workdir,
        steps=args.steps,
        save_at=tuple(args.save_at),
        resume=args.resume,
        model_config=config,
        devices=args.devices,
        num_nodes=args.num_nodes,
        accelerator=args.accelerator,
        strategy=args.strategy,
        seed=args.seed,
        plan={"pack_size": args.pack_size, "window": args.window, "scope": args.scope},
        packing=args.packing,
        batch={"collate": args.layout, "max_seq_len": config.max_seq_len},
        loader={"num_workers": args.num_workers},
        cache_dir=args.cache_dir,
    )
    print(f"done: step {out['step']}, model {asdict(config)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
