"""Tensor and data parallelism for Lightning's ``ModelParallelStrategy``, by attribute names.

``parallelize(module, device_mesh)`` is a ``parallelize_fn`` for Fabric
(``ModelParallelStrategy(parallelize_fn=parallelize)``) and what a LightningModule's
``configure_model`` calls under the Trainer (``TinyGPT`` does). It applies, in the order
torchtitan and Lightning's examples use:

1. **tensor parallelism** on the ``tensor_parallel`` dimension (``torch.distributed.tensor.
   parallel``): Megatron-style pairs inside one parent module, the ``nn.Linear`` children named
   in ``colwise`` split by output features and those named in ``rowwise`` by input features
   (their output all-reduced); the weights left replicated take the values of the group's
   first process, as the split ones do. A pair needs both halves in the same parent, so a block is
   split only where the split is exact: the gated MLP (``gate``/``up`` + ``down``: TinyGPT;
   ``gate_proj``/``up_proj`` + ``down_proj``: Llama, Qwen, Mistral in Hugging Face naming) and
   attention with separate projections (``q_proj``/``k_proj``/``v_proj`` + ``o_proj``: Hugging
   Face's attention reshapes to ``(-1, head_dim)``, so each rank runs its own heads; key/value
   heads must divide by the tensor-parallel size). TinyGPT's fused ``qkv`` is not split (a
   contiguous split of a fused projection would mix query, key and value columns): its
   attention stays replicated, its MLP is split.
2. **data parallelism** on the ``data_parallel`` dimension with FSDP2 (``fully_shard``): every
   block of a ``nn.ModuleList`` (the transformer layers) and every other child of the root.
   ``ModelParallelStrategy`` does not synchronise gradients across data-parallel ranks by
   itself; without this step the replicas would drift apart.

Runs on CPU with gloo (2 data-parallel x 2 tensor-parallel in 4 processes, the integration
tests) and on GPUs with NCCL. What the data side must do under this layout (identical packs in
a tensor-parallel group, the plan made for the data-parallel size) is
``lightning_module.trainer_layout``'s job.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from torch import nn

COLWISE: tuple[str, ...] = ("gate", "up", "gate_proj", "up_proj", "q_proj", "k_proj", "v_proj")
"""Linear layers split by output features (the first half of a pair)."""
ROWWISE: tuple[str, ...] = ("down", "down_proj", "o_proj")
"""Linear layers split by input features, their outputs summed (the second half of a pair)."""


def tensor_parallel_plan(
    module: nn.Module,
    tp_size: int,
    colwise: Sequence[str] = COLWISE,
    rowwise: Sequence[str] = ROWWISE,
) -> dict[str, str]:
    """``{dotted name: "colwise" | "rowwise"}`` for every ``nn.Linear`` of ``module`` named in
    ``colwise`` / ``rowwise`` whose parent holds both kinds (an exact Megatron pair). Raises
    ``ValueError`` naming a layer whose split dimension ``tp_size`` does not divide."""
    plan: dict[str, str] = {}
    for parent_name, parent in module.named_modules():
        children = {n: c for n, c in parent.named_children() if isinstance(c, nn.Linear)}
        cols = [n for n in children if n in colwise]
        rows = [n for n in children if n in rowwise]
        if not cols or not rows:
            continue
        prefix = f"{parent_name}." if parent_name else ""
        for name in cols + rows:
            layer = children[name]
            kind = "colwise" if name in cols else "rowwise"
            size = layer.out_features if kind == "colwise" else layer.in_features
            if size % tp_size:
                raise ValueError(
                    f"{prefix}{name}: {size} {'output' if kind == 'colwise' else 'input'} "
                    f"features cannot be split over tensor_parallel_size={tp_size}; choose a "
                    "tensor-parallel size that divides it"
                )
            plan[prefix + name] = kind
    return plan


def _is_parallelized(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _same_in_group(module: nn.Module, tp_mesh: Any) -> None:
    """Give every replicated (not split) parameter and buffer the values of the group's
    first process, as ``distribute_tensor`` does for the split ones: processes initialised
    with different seeds would otherwise run one model with several sets of replicated
    weights, and each process's loss would differ although the packs are the same. Tensors
    still on the meta device (materialised later from the processes' seeds) are left alone."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = tp_mesh.get_group()
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if not isinstance(tensor, DTensor) and not tensor.is_meta:
                dist.broadcast(tensor.data, group=group, group_src=0)


def parallelize(
    module: nn.Module,
    device_mesh: Any,
    *,
    colwise: Sequence[str] = COLWISE,
    rowwise: Sequence[str] = ROWWISE,
) -> nn.Module:
    """Tensor parallelism then FSDP2 on ``device_mesh`` (Lightning's 2D mesh:
    ``data_parallel`` x ``tensor_parallel``), in place; returns ``module``. A module already
    holding distributed parameters is returned as it is (``configure_model`` may run twice).
    Raises ``ValueError`` if tensor parallelism is asked (size > 1) and no layer pair matches
    ``colwise``/``rowwise``: the model would silently run replicated."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    if _is_parallelized(module):
        return module
    tp_mesh = device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        plan = tensor_parallel_plan(module, tp_mesh.size(), colwise, rowwise)
        if not plan:
            raise ValueError(
                f"{type(module).__name__}: no pair of linear layers named {list(colwise)} and "
                f"{list(rowwise)} in one parent module; pass colwise=/rowwise= with the names "
                "of its layers, or use tensor_parallel_size=1"
            )
        styles: dict[str, ParallelStyle] = {
            name: ColwiseParallel() if kind == "colwise" else RowwiseParallel()
            for name, kind in plan.items()
        }
        parallelize_module(module, tp_mesh, styles)
        _same_in_group(module, tp_mesh)
    dp_mesh = device_mesh["data_parallel"]
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise ValueError(
            f"{type(module).__name__} holds parameters {own} directly; FSDP shards child "
            "modules: move them into a submodule"
        )
    lists: list[str] = []  # the outermost ModuleLists only: FSDP2 wraps bottom-up, once
    for name, sub in module.named_modules():
        if isinstance(sub, nn.ModuleList) and not any(name.startswith(f"{o}.") for o in lists):
            lists.append(name)
            for block in sub:
                fully_shard(block, mesh=dp_mesh)
    for child in module.children():
        if not isinstance(child, nn.ModuleList) and any(True for _ in child.parameters()):
            fully_shard(child, mesh=dp_mesh)
    return module
