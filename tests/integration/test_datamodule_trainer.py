"""The DataModule follows the trainer: every shipped YAML through LightningCLI plans with the
trainer's world size, ranks per node and accumulation and the collate's layout; an explicit
value that contradicts the trainer is refused naming which setting wins.

The configs target GPUs (devices x nodes up to 8 x 8); here they are built on CPU with only the
accelerator changed, so the Trainer's layout is the config's, and the DataModule's ``setup()``
runs for rank 0 of that layout on the test dataset (a mixture's streams on copies of it). A
tensor-parallel config (``ModelParallelStrategy``, not launched here) plans for its
data-parallel ranks, from the sizes its strategy was given.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import yaml
from lightning.pytorch.cli import LightningCLI

from lightning_module.cli import BCLCLI
from lightning_module.datamodule import BCLDataModule
from lightning_module.options import ConfigError
from lightning_module.parallel import tensor_parallel_plan
from tests.hf_models import tiny_llama_dir

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


HF_MODEL = "lightning_module.hf_causal_lm.HFCausalLM"


def tiny_llama(directory: Path) -> Path:
    """A tiny random Llama (config.json only): what the SFT configs' model directory holds."""
    return tiny_llama_dir(
        directory, vocab_size=128, max_position_embeddings=512, width=16, layers=1
    )


def shipped_strategy(cfg: dict[str, Any]) -> Any:
    """The config's strategy, built alone: FSDP needs GPUs to build a Trainer, not to parse."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import Strategy

    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy | str)
    return parser.instantiate(
        parser.parse_object({"strategy": cfg["trainer"]["strategy"]})
    ).strategy


def cli_from(path: Path, tmp: Path, data_dir: Path) -> LightningCLI:
    """LightningCLI on ``path`` as shipped, built (not run) on CPU over ``data_dir`` (an SFT
    config's model directory: a tiny random Llama; FSDP built apart, DDP for the Trainer)."""
    cfg: dict[str, Any] = yaml.safe_load(path.read_text())
    cfg["trainer"].update(accelerator="cpu", default_root_dir=str(tmp), logger=False)
    cfg["trainer"]["callbacks"] = []
    strategy = cfg["trainer"].get("strategy")
    if isinstance(strategy, dict) and strategy["class_path"].endswith("FSDPStrategy"):
        shipped_strategy(cfg)  # it builds as shipped; the CPU Trainer takes DDP instead
        cfg["trainer"]["strategy"] = "ddp"
    if cfg["model"]["class_path"] == HF_MODEL:
        cfg["model"]["init_args"]["model"] = str(tiny_llama(tmp / "model"))
    data = cfg["data"]
    data.pop("cache_dir", None)
    data.get("batch", {}).pop("processor", None)  # cpu_vlm's: the test dataset is text
    if "streams" in data:  # one copy of the test dataset per stream (a path is named once)
        for i, stream in enumerate(data["streams"]):
            stream["path"] = str(shutil.copytree(data_dir, tmp / f"stream-{i}"))
    else:
        data["data"] = str(data_dir)
    config = tmp / path.name
    config.write_text(yaml.safe_dump(cfg))
    return BCLCLI(  # the class python -m lightning_module runs (it takes the configs' root)
        pl.LightningModule,
        BCLDataModule,
        subclass_mode_model=True,
        run=False,
        args=["--config", str(config)],
    )


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_plans_what_its_trainer_runs(
    path: Path, mds_dir: Path, tmp_path: Path
) -> None:
    shipped = yaml.safe_load(path.read_text())
    cli = cli_from(path, tmp_path, mds_dir)
    trainer, module = cli.trainer, cli.datamodule
    assert isinstance(module, BCLDataModule)
    module.trainer = trainer  # what trainer.fit(model, datamodule) does before setup()
    module.model_max_seq_len(cli.model)  # setup() reads it from trainer.lightning_module
    module.setup("fit")
    assert module.dataset is not None
    plan = module.dataset.config.plan
    nodes = shipped["trainer"].get("num_nodes", 1)
    devices = shipped["trainer"]["devices"]
    accumulate = shipped["trainer"].get("accumulate_grad_batches", 1)
    strategy = shipped["trainer"].get("strategy")
    sizes = strategy.get("init_args", {}) if isinstance(strategy, dict) else {}
    tp = sizes.get("tensor_parallel_size", 1)  # a tensor-parallel group: one data-parallel rank
    assert sizes.get("data_parallel_size", nodes * devices) * tp == nodes * devices
    assert (plan.world_size, plan.ranks_per_node) == (nodes * devices // tp, max(1, devices // tp))
    assert trainer.world_size == nodes * devices and trainer.num_devices == devices
    layout = module.layout_used
    assert layout is not None and (layout.process.group_size, layout.process.local_processes) == (
        tp,
        devices,
    )
    assert plan.grad_accum == accumulate == trainer.accumulate_grad_batches
    assert plan.layout == shipped["data"].get("batch", {}).get("collate", "padded") == module.layout
    shipped_plan = shipped["data"].get("plan", {})
    assert plan.contract == shipped_plan.get("contract", "pack")  # h200_node: tokens
    assert plan.max_tokens == shipped_plan.get("max_tokens")
    if tp > 1:  # the model's configure_model can split it at that size
        assert tensor_parallel_plan(cli.model, tp)


SFT_CONFIGS = [p for p in CONFIGS if HF_MODEL in p.read_text() and p.stem != "cpu_vlm"]
"""The GPU configs of a text model (cpu_vlm trains a VLM on CPU: tests/integration/
test_vlm_training.py runs it)."""


def test_the_gpu_configs_train_a_hugging_face_model_with_fsdp_in_bf16() -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    assert {p.stem for p in SFT_CONFIGS} == {"h200_node", "multinode"}
    for path in SFT_CONFIGS:
        cfg = yaml.safe_load(path.read_text())
        strategy = shipped_strategy(cfg)
        assert type(strategy).__name__ == "FSDPStrategy", path.name
        policy = strategy.kwargs["auto_wrap_policy"]
        assert isinstance(policy, ModuleWrapPolicy)
        assert LlamaDecoderLayer in policy._module_classes
        assert cfg["trainer"]["precision"] == "bf16-mixed"
        data = cfg["data"]
        assert (data["batch"]["collate"], data["batch"]["labels"]) == ("packed", "unshifted")
        assert "--loss-on assistant" in path.read_text(), path.name


def test_accumulation_and_layout_reach_the_plan_and_the_cursor(
    mds_dir: Path, tmp_path: Path
) -> None:
    """A default DataModule (padded collate) under a Trainer accumulating 3 micro-batches."""
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, accumulate_grad_batches=3, logger=False,
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    module = BCLDataModule(str(mds_dir), plan={"pack_size": 4, "window": 3})
    module.trainer = trainer
    module.setup("fit")
    assert module.dataset is not None
    plan = module.dataset.config.plan
    assert (plan.grad_accum, plan.layout) == (3, "padded")
    module.train_dataloader()
    saved = module.state_dict()["reader"]["config"]["plan"]
    assert (saved["grad_accum"], saved["layout"]) == (3, "padded")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"plan": {"pack_size": 4, "window": 3, "grad_accum": 2}},
            r"^data\.plan\.grad_accum: the trainer's accumulate_grad_batches .* decides it; "
            r"drop the key$",
        ),
        (
            {"plan": {"pack_size": 4, "window": 3}, "ranks_per_node": 4},
            r"^data\.ranks_per_node is not a key of BCLDataModule; the trainer's data-parallel "
            r"ranks per node decides it: drop the key$",
        ),
        (
            {"plan": {"world_size": 2}},
            r"^data\.plan\.world_size: the trainer's data-parallel size decides it",
        ),
    ],
)
def test_a_key_the_trainer_decides_is_refused_naming_what_decides_it(
    kwargs: dict[str, Any], match: str
) -> None:
    """What the trainer decides is no key: given anyway, it is refused in one line when the
    DataModule is built (a ConfigError: ``python -m lightning_module`` prints that line)."""
    with pytest.raises(ConfigError, match=match):
        BCLDataModule("DIR", **kwargs)


def test_a_planner_layout_is_refused_naming_the_collate() -> None:
    """The plan's cost layout follows ``batch.collate``: a ``plan.layout`` is refused."""
    with pytest.raises(ConfigError, match=r"^data\.plan\.layout: batch\.collate"):
        BCLDataModule("DIR", plan={"layout": "packed"})
    with pytest.raises(ConfigError, match=r"^data\.layout is not a key.*batch\.collate"):
        BCLDataModule("DIR", layout="packed")
