"""TrainerLayout: data-parallel ranks from the trainer's strategy, data-parallel ranks per node,
and the physical processes per node Mosaic Streaming is given; the tensor-parallel plan by
attribute names. Real launches (4 gloo processes) are in tests/integration/test_mesh_layouts.py.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn

from lightning_module.parallel import tensor_parallel_plan
from lightning_module.tinygpt import TinyGPT, TinyGPTConfig
from lightning_module.trainer_layout import TrainerLayout, data_parallel_of, mesh_data_parallel


@pytest.mark.parametrize(
    ("processes", "per_node", "dp_size", "want_per_node"),
    [
        (4, 4, 4, 4),  # plain DDP: every process its own data-parallel rank
        (4, 4, 2, 2),  # 2 DP x 2 TP on one node
        (64, 8, 8, 1),  # 8 nodes x TP=8: one data-parallel rank per node
        (64, 8, 16, 2),  # 8 nodes x TP=4
        (32, 8, 2, 1),  # TP=16 spans two nodes of 8
    ],
)
def test_every_process_of_a_group_has_one_data_parallel_rank(
    processes: int, per_node: int, dp_size: int, want_per_node: int
) -> None:
    group = processes // dp_size
    layouts = [
        TrainerLayout.of_processes(
            global_rank=g,
            processes=processes,
            processes_per_node=per_node,
            data_parallel=(g // group, dp_size),
        ).process
        for g in range(processes)
    ]
    for x in layouts:
        assert (x.world_size, x.ranks_per_node, x.group_size) == (dp_size, want_per_node, group)
        assert x.local_processes == per_node  # streaming keeps the physical layout
    # the planner's node of a data-parallel rank holds that rank's processes' node
    for g, x in enumerate(layouts):
        if group <= per_node:
            assert x.rank // x.ranks_per_node == g // per_node


def test_no_mesh_means_every_process_is_a_rank() -> None:
    layout = TrainerLayout.of_processes(
        global_rank=3, processes=8, processes_per_node=4, data_parallel=None
    )
    assert (layout.process.rank, layout.process.world_size, layout.process.ranks_per_node, layout.process.group_size) == (
        3, 8, 4, 1,
    )  # fmt: skip


def test_a_mesh_with_data_parallel_inside_is_refused() -> None:
    # mesh (tensor_parallel=2, data_parallel=2): process 1 is data-parallel rank 1
    with pytest.raises(ValueError, match=r"data-parallel dimension outermost"):
        TrainerLayout.of_processes(
            global_rank=1, processes=4, processes_per_node=4, data_parallel=(1, 2)
        )
    with pytest.raises(ValueError, match=r"ranks_per_node=4 does not divide world_size=6"):
        TrainerLayout.of_processes(
            global_rank=0, processes=6, processes_per_node=4, data_parallel=None
        )  # LOCAL_WORLD_SIZE that does not divide the world: refused, not guessed
    with pytest.raises(ValueError, match=r"does not divide the 6 processes"):
        TrainerLayout.of_processes(
            global_rank=0, processes=6, processes_per_node=6, data_parallel=(0, 4)
        )


def test_an_unlaunched_model_parallel_trainer_plans_for_its_data_parallel_size() -> None:
    """A Trainer built but not fitted (as the config tests build one): no mesh yet, the sizes
    the strategy was given; ``"auto"`` as Lightning resolves it (DP = nodes, TP = devices)."""
    for strategy, want in (
        (ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), (0, 2)),
        (ModelParallelStrategy(), (0, 1)),  # auto: 1 node -> DP 1, TP 4
    ):
        trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, logger=False)
        assert data_parallel_of(trainer.strategy) == want
        layout = TrainerLayout.of_trainer(trainer)
        assert (layout.process.rank, layout.process.world_size) == want
        assert layout.process.local_processes == 4
    ddp = pl.Trainer(accelerator="cpu", devices=4, strategy=DDPStrategy(), logger=False)
    layout = TrainerLayout.of_trainer(ddp)
    assert (
        layout.process.world_size,
        layout.process.ranks_per_node,
        layout.process.group_size,
    ) == (4, 4, 1)


class LlamaStyleBlock(nn.Module):
    """Hugging Face Llama naming: separate q/k/v/o projections and a gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            self.self_attn.add_module(name, nn.Linear(16, 16, bias=False))
        self.mlp = nn.Module()
        self.mlp.add_module("gate_proj", nn.Linear(16, 32, bias=False))
        self.mlp.add_module("up_proj", nn.Linear(16, 32, bias=False))
        self.mlp.add_module("down_proj", nn.Linear(32, 16, bias=False))


def test_the_tensor_parallel_plan_splits_exact_pairs_only() -> None:
    tiny = TinyGPT(TinyGPTConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, ffn_hidden=32))
    plan = tensor_parallel_plan(tiny, 2)
    assert plan == {
        f"blocks.{i}.mlp.{name}": kind
        for i in range(2)
        for name, kind in (("gate", "colwise"), ("up", "colwise"), ("down", "rowwise"))
    }  # attention's fused qkv/out is not a pair of ours: it stays replicated
    llama = nn.ModuleDict({"layers": nn.ModuleList([LlamaStyleBlock()])})
    plan = tensor_parallel_plan(llama, 4)
    assert plan["layers.0.self_attn.q_proj"] == "colwise"
    assert plan["layers.0.self_attn.o_proj"] == "rowwise"
    assert plan["layers.0.mlp.down_proj"] == "rowwise"
    assert len(plan) == 7
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.q_proj: 16 output features"):
        tensor_parallel_plan(llama, 3)
    lone = nn.ModuleDict({"mlp": nn.ModuleDict({"down": nn.Linear(4, 4)})})
    assert tensor_parallel_plan(lone, 2) == {}  # a half pair is never split


class FakeMesh:
    """A ``DeviceMesh`` as ``mesh_data_parallel`` reads it: names, and a sub-mesh per name
    with ``get_local_rank()`` and ``size()`` (a real one needs a process group)."""

    def __init__(self, shape: dict[str, int], coords: dict[str, int]) -> None:
        self.mesh_dim_names = tuple(shape)
        self.shape, self.coords = shape, coords

    def __getitem__(self, name: str) -> FakeMesh:
        return FakeMesh({name: self.shape[name]}, {name: self.coords[name]})

    def get_local_rank(self) -> int:
        return next(iter(self.coords.values()))

    def size(self) -> int:
        return next(iter(self.shape.values()))


def test_a_context_parallel_mesh_is_one_data_parallel_rank_per_group() -> None:
    """DP 2 x CP 2 x TP 2 on 8 processes of one node: groups of 4 (CP x TP), 2 ranks."""
    shape = {"data_parallel": 2, "context_parallel": 2, "tensor_parallel": 2}
    for g in range(8):
        coords = {"data_parallel": g // 4, "context_parallel": g // 2 % 2, "tensor_parallel": g % 2}
        layout = TrainerLayout.of_processes(
            global_rank=g,
            processes=8,
            processes_per_node=8,
            data_parallel=mesh_data_parallel(FakeMesh(shape, coords)),
        )
        assert (layout.process.rank, layout.process.world_size, layout.process.ranks_per_node) == (
            g // 4,
            2,
            2,
        )
        assert (layout.process.group_size, layout.process.local_processes) == (4, 8)
    assert mesh_data_parallel(FakeMesh({"tensor_parallel": 2}, {"tensor_parallel": 1})) is None


def test_an_unlaunched_fabric_plans_for_its_data_parallel_size() -> None:
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel

    strategy = FabricModelParallel(
        parallelize_fn=lambda m, _: m, data_parallel_size=2, tensor_parallel_size=2
    )
    fabric = Fabric(accelerator="cpu", devices=4, strategy=strategy)
    layout = TrainerLayout.of_fabric(fabric)
    assert (layout.process.rank, layout.process.world_size, layout.process.group_size, layout.process.local_processes) == (
        0, 2, 2, 4,
    )  # fmt: skip
