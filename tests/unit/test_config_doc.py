"""docs/config.md and the shipped configs follow the dataclasses that declare every key.

- The key list of docs/config.md is what ``lightning_module.config_doc.render`` makes from the
  dataclasses' fields, defaults and docstrings (regenerate it with
  ``python -m lightning_module.config_doc``);
- every key of every shipped config is a documented key (no flat key);
- a flat config is refused in one line naming the grouped key, in Python and through
  ``python -m lightning_module``; the nested config builds the DataModule.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from bcl_stream import ProcessLayout
from bcl_stream.training import reader_config
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
FLAT = {"data": "DIR", "window": 3, "num_workers": 1, "plan": {"carry_span": 5}}
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


def test_the_nested_config_builds_the_datamodule(tmp_path: Path) -> None:
    layout = TrainerLayout(process=ProcessLayout(world_size=2), grad_accum=1)
    new, new_warnings = cli_module(tmp_path, NEW)
    assert new_warnings == []
    assert new.evaluation.sources == {"val": ["VAL"], "test": []}
    assert new.evaluation.packing == "bcl"
    assert (new.batch.max_seq_len, new.loader_options.num_workers) == (64, 1)
    plan = reader_config(new.knobs, new._context(layout)).plan
    assert (plan.window, plan.scope, plan.carry_span, plan.layout) == (3, "rank", 5, "packed")


def test_a_flat_config_is_refused_in_one_line_naming_the_grouped_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through ``python -m lightning_module``: one line, exit 2, before LightningCLI's usage."""
    from lightning_module.__main__ import run

    config = tmp_path / "flat.yaml"
    config.write_text(yaml.safe_dump({"model": MODEL, "data": {**FLAT, "data": str(tmp_path)}}))
    assert run(["fit", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "python -m lightning_module: error: data.num_workers is not a key of BCLDataModule; "
        "use data.loader.num_workers"
    ]
    nested = tmp_path / "nested.yaml"
    here = {"data": str(tmp_path), "eval": {"val_data": str(tmp_path)}}
    nested.write_text(yaml.safe_dump({"model": MODEL, "data": {**NEW, **here}}))
    assert run(["fit", "--config", str(nested), "--data.window", "9"]) == 2
    assert capsys.readouterr().err.strip().endswith("; use data.plan.window")


def test_one_key_of_a_group_is_overridden_on_the_command_line(tmp_path: Path) -> None:
    module, _ = cli_module(tmp_path, NEW, "--data.plan.window", "7")
    assert (module.plan.window, module.plan.carry_span) == (7, 5)


def test_unknown_keys_are_refused_naming_where_they_go() -> None:
    from lightning_module import BCLDataModule

    with pytest.raises(ValueError, match=r"plan has unknown keys \['num_workers'\].*loader"):
        BCLDataModule("DIR", plan={"num_workers": 2})
    with pytest.raises(ValueError, match=r"^data\.windwo is not a key of BCLDataModule; docs/"):
        BCLDataModule("DIR", windwo=3)
    with pytest.raises(ValueError, match=r"^data\.window is not a key.*; use data\.plan\.window$"):
        BCLDataModule("DIR", window=3)
    with pytest.raises(ValueError, match=r"^data\.layout is not a key.*batch\.collate"):
        BCLDataModule("DIR", layout="packed")
    with pytest.raises(ValueError, match=r"^data\.plan\.layout: batch\.collate .* decides it"):
        BCLDataModule("DIR", plan={"layout": "padded"})


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{cfg}"],  # data.eval.val_data in the YAML
        ["--data.data", "{tmp}", "--data.eval.val_data", "{tmp}/nope"],
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
