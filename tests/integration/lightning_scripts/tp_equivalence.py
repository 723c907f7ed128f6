"""``parallelize`` splits a model without changing what it computes: 2 CPU processes (gloo), a
1 x 2 mesh (``data_parallel`` x ``tensor_parallel``), TinyGPT and a tiny Hugging Face
``LlamaForCausalLM`` (separate q/k/v/o projections, grouped key/value heads), each built from
the same seed in both processes. Each process compares the split model's output (loss and
logits, then the loss after one optimizer step on both) with the unsplit copy it also keeps.

Usage: ``python tp_equivalence.py PORT OUT_JSON``; rank 0 writes
``{name: {"max_logit_diff", "loss", "loss_unsplit", "split_layers", "step_loss",
"step_loss_diff"}}``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lightning_module.parallel import parallelize, tensor_parallel_plan
from lightning_module.tinygpt import TinyGPT, TinyGPTConfig

TP = 2


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(config)


class LlamaLoss(nn.Module):
    """``model(input_ids, labels).loss`` and the logits, as one module (FSDP wraps children)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama()

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=ids, labels=ids)
        return out.loss, out.logits


class TinyLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = TinyGPT(
            TinyGPTConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, ffn_hidden=64)
        )

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
        batch = {"input_ids": ids, "labels": labels}
        return self.model.loss(batch), self.model(batch)


def full(t: Any) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def compare(build: Any, mesh: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    unsplit = build()
    split = copy.deepcopy(unsplit)
    layers = len(tensor_parallel_plan(split, TP))
    parallelize(split, mesh)
    # optimizers before the first forward, as Fabric and the Trainer build them: FSDP2 swaps
    # the registered parameters for unsharded ones between a forward and its backward
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (unsplit, split)]
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    loss_a, logits_a = unsplit(ids)
    loss_b, logits_b = split(ids)
    result = {
        "max_logit_diff": float((full(logits_b) - logits_a).abs().max()),
        "loss": float(loss_b),
        "loss_unsplit": float(loss_a),
        "split_layers": layers,
    }
    for loss, optimizer in zip((loss_a, loss_b), optimizers, strict=True):
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        result["step_loss"] = float(split(ids)[0])
        result["step_loss_diff"] = abs(result["step_loss"] - float(unsplit(ids)[0]))
    return result


def worker(rank: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    mesh = init_device_mesh("cpu", (1, TP), mesh_dim_names=("data_parallel", "tensor_parallel"))
    results = {"tinygpt": compare(TinyLoss, mesh), "llama": compare(LlamaLoss, mesh)}
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import transformers.models.llama.modeling_llama  # noqa: F401  # once, before the fork

    # fork, not spawn: the children inherit torch and transformers instead of importing them
    # again (no process group exists before the fork)
    mp.start_processes(
        worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=TP, join=True, start_method="fork"
    )
