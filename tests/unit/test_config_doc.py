"""docs/config.md and the shipped configs follow the dataclasses that declare every key.

- The key list of docs/config.md is what ``lightning_module.config_doc.render`` makes from the
  dataclasses' fields, defaults and docstrings (regenerate it with
  ``python -m lightning_module.config_doc``);
- every key of every shipped config is a documented key of this release (no flat key of an
  earlier release);
- an old flat config and its nested twin build the same DataModule through LightningCLI, the
  old one with one warning line naming each new key; a key that never existed is refused.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from bcl_stream import ProcessLayout
from lightning_module.config_doc import DOC, documented, render
from lightning_module.trainer_layout import TrainerLayout

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_the_doc_lists_every_key_as_the_dataclasses_declare_it() -> None:
    assert documented(DOC.read_text(encoding="utf-8")) == render(), (
        "docs/config.md disagrees with the dataclasses: run python -m lightning_module.config_doc"
    )


def documented_keys() -> set[str]:
    return set(re.findall(r"^- `data\.([a-z_.]+)` = ", render(), flags=re.M))


def keys_of(section: dict[str, Any], prefix: str = "") -> set[str]:
    groups = {k.split(".")[0] for k in documented_keys() if "." in k}
    out = set()
    for key, value in section.items():
        if not prefix and key in groups:
            assert isinstance(value, dict), key
            out |= keys_of(value, f"{key}.")
        else:
            out.add(prefix + key)
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_uses_documented_keys_only(path: Path) -> None:
    data = yaml.safe_load(path.read_text())["data"]
    assert keys_of(data) <= documented_keys(), sorted(keys_of(data) - documented_keys())


MODEL = {
    "class_path": "lightning_module.tinygpt.TinyGPT",
    "init_args": {"config": {"vocab_size": 64, "d_model": 8, "n_layers": 1, "n_heads": 2}},
}
OLD = {
    "data": "DIR", "pack_size": 4, "window": 3, "scope": "rank", "layout": "packed",
    "max_seq_len": 64, "num_workers": 1, "val_data": "VAL", "eval_packing": "bcl",
    "plan": {"carry_span": 5},
}  # fmt: skip
NEW = {
    "data": "DIR",
    "plan": {"pack_size": 4, "window": 3, "scope": "rank", "carry_span": 5},
    "batch": {"collate": "packed", "max_seq_len": 64},
    "loader": {"num_workers": 1},
    "eval": {"val_data": "VAL", "packing": "bcl"},
}


def cli_module(tmp_path: Path, data: dict[str, Any], *args: str) -> tuple[Any, list[str]]:
    """The DataModule the LightningCLI of ``python -m lightning_module`` builds from a config with this data section (not run), and
    the warnings it gave."""
    from lightning.pytorch import LightningModule

    from lightning_module import BCLDataModule
    from lightning_module.cli import BCLCLI

    config = tmp_path / "config.yaml"
    trainer = {"accelerator": "cpu", "logger": False, "default_root_dir": str(tmp_path)}
    config.write_text(yaml.safe_dump({"trainer": trainer, "model": MODEL, "data": data}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli = BCLCLI(  # the class python -m lightning_module runs
            LightningModule, BCLDataModule, subclass_mode_model=True, run=False,
            args=["--config", str(config), *args],
        )  # fmt: skip
    ours = [str(w.message) for w in seen if "BCLDataModule" in str(w.message)]
    return cli.datamodule, ours


def test_an_old_flat_config_and_its_nested_twin_build_the_same_datamodule(tmp_path: Path) -> None:
    layout = TrainerLayout(process=ProcessLayout(world_size=2), grad_accum=1)
    old, old_warnings = cli_module(tmp_path, OLD)
    new, new_warnings = cli_module(tmp_path, NEW)
    assert new_warnings == []
    assert len(old_warnings) == 1  # one line, naming every new key
    for name in ("window -> plan.window", "layout -> batch.collate", "val_data -> eval.val_data"):
        assert name in old_warnings[0], old_warnings[0]
    assert old.reader_config(layout) == new.reader_config(layout)
    assert (old.batch, old.loader_options) == (new.batch, new.loader_options)
    assert old.evaluation.sources == new.evaluation.sources == {"val": ["VAL"], "test": []}
    assert old.evaluation.packing == new.evaluation.packing == "bcl"
    plan = new.reader_config(layout).plan
    assert (plan.window, plan.scope, plan.carry_span, plan.layout) == (3, "rank", 5, "packed")


def test_one_key_of_a_group_is_overridden_on_the_command_line(tmp_path: Path) -> None:
    module, _ = cli_module(tmp_path, NEW, "--data.plan.window", "7")
    assert (module.plan.window, module.plan.carry_span) == (7, 5)
    old, seen = cli_module(tmp_path, NEW, "--data.window", "9")  # an old key still wins
    assert old.plan.window == 9 and "window -> plan.window" in seen[0]


def test_unknown_keys_are_refused_naming_where_they_go() -> None:
    from lightning_module import BCLDataModule

    with pytest.raises(ValueError, match=r"plan has unknown keys \['num_workers'\].*loader"):
        BCLDataModule("DIR", plan={"num_workers": 2})
    with pytest.raises(TypeError, match=r"unknown arguments \['windwo'\]"):
        BCLDataModule("DIR", windwo=3)
    with (
        pytest.warns(FutureWarning, match="flat keys of an earlier release: layout"),
        pytest.raises(ValueError, match=r"plan\.layout='padded' contradicts layout='packed'"),
    ):
        BCLDataModule("DIR", layout="packed", plan={"layout": "padded"})


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{cfg}"],  # data.eval.val_data in the YAML
        ["--data.data", "{tmp}", "--data.eval.val_data", "{tmp}/nope"],
        ["--data.data", "{tmp}", "--data.val_data", "{tmp}/nope"],  # the earlier flat key
    ],
)
def test_the_early_path_check_reads_the_eval_group(tmp_path: Path, argv: list[str]) -> None:
    from bcl_stream.errors import DatasetError
    from lightning_module.cli_checks import check_paths

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"data": str(tmp_path), "eval": {"val_data": "/no"}}}))
    args = [a.format(cfg=cfg, tmp=tmp_path) for a in argv]
    with pytest.raises(DatasetError, match=r"^data\.eval\.val_data: .*no such dataset directory"):
        check_paths(["fit", *args])


def test_a_bad_value_in_a_group_is_one_of_our_errors_naming_the_key() -> None:
    """``python -m lightning_module`` prints our errors as one line (a ValueError too)."""
    from bcl_stream.errors import BCLStreamError
    from lightning_module import BCLDataModule

    with pytest.raises(BCLStreamError, match=r"^data\.plan: window must be an integer"):
        BCLDataModule("DIR", plan={"window": "abc"})
    with pytest.raises(ValueError, match=r"^data\.loader: loader\.persistent_workers=True"):
        BCLDataModule("DIR", loader={"persistent_workers": True})
