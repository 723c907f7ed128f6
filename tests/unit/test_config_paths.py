"""A config's relative paths resolve against its root, never the current directory
(``lightning_module/config_paths.py``): the rewritten command line, without Lightning."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_module.config_paths import ROOT_ENV, resolve_config_paths

CONFIG: dict[str, Any] = {
    "trainer": {
        "default_root_dir": "runs/work",
        "callbacks": [
            {
                "class_path": "lightning_module.callbacks.PackLogger",
                "init_args": {"directory": "runs/work/logs"},
            },
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {"dirpath": "/abs/ckpt", "every_n_train_steps": 10},
            },
        ],
    },
    "data": {
        "data": "data/mds",
        "cache_dir": "s3://bucket/cache",
        "eval": {
            "val_streams": ["data/a:proportion=0.5", "s3://bucket/b:proportion=0.5"],
            "test_streams": [{"path": "data/c", "repeat": 2}],
        },
    },
    "ckpt_path": "last",
}


def write(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def options(argv: list[str]) -> dict[str, Any]:
    """The ``--key=value`` options the rewrite added (JSON values decoded)."""
    out = {}
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            out[key] = yaml.safe_load(value) if value[:1] in "[{" else value
    return out


def test_relative_paths_resolve_against_the_config_files_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # the current directory must play no part
    config = write(tmp_path / "proj" / "configs" / "run.yaml", {"root": "..", **CONFIG})
    got = options(resolve_config_paths(["fit", "--config", str(config)]))
    proj = str(tmp_path / "proj")
    assert got["trainer.default_root_dir"] == f"{proj}/runs/work"
    assert got["data.data"] == f"{proj}/data/mds"
    callbacks = got["trainer.callbacks"]
    assert callbacks[0]["init_args"] == {"directory": f"{proj}/runs/work/logs"}
    assert callbacks[1] == CONFIG["trainer"]["callbacks"][1]  # absolute: untouched
    assert got["data.eval.val_streams"] == [
        f"{proj}/data/a:proportion=0.5",
        "s3://bucket/b:proportion=0.5",
    ]
    assert got["data.eval.test_streams"] == [{"path": f"{proj}/data/c", "repeat": 2}]
    assert "data.cache_dir" not in got and "ckpt_path" not in got  # a URL, Lightning's "last"


def test_without_a_root_key_the_files_own_directory_is_the_root(tmp_path: Path) -> None:
    config = write(tmp_path / "configs" / "run.yaml", CONFIG)
    got = options(resolve_config_paths(["fit", "--config", str(config)], env={}))
    assert got["data.data"] == str(tmp_path / "configs" / "data" / "mds")


def test_root_option_beats_the_environment_which_beats_the_config(tmp_path: Path) -> None:
    config = write(tmp_path / "configs" / "run.yaml", {"root": "..", **CONFIG})
    env = {ROOT_ENV: str(tmp_path / "from_env")}
    by_env = options(resolve_config_paths(["fit", "-c", str(config)], env=env))
    assert by_env["data.data"] == str(tmp_path / "from_env" / "data" / "mds")
    argv = ["fit", f"--config={config}", "--root", str(tmp_path / "given")]
    by_option = options(resolve_config_paths(argv, env=env))
    assert by_option["data.data"] == str(tmp_path / "given" / "data" / "mds")


def test_the_added_options_sit_right_after_their_config_so_later_options_win(
    tmp_path: Path,
) -> None:
    """jsonargparse applies options in order: a path typed after the config (relative to the
    current directory) still overrides it, and a second config's own paths override both."""
    first = write(tmp_path / "a" / "one.yaml", CONFIG)
    second = write(tmp_path / "b" / "two.yaml", {"data": {"data": "other"}})
    argv = ["fit", "--config", str(first), "--data.data", "mine", "--config", str(second)]
    out = resolve_config_paths(argv, env={})
    given = out.index("--data.data")
    added = [i for i, a in enumerate(out) if a.startswith("--data.data=")]
    assert added[0] < given < out.index(str(second)) < added[1]
    assert out[added[1]] == f"--data.data={tmp_path / 'b' / 'other'}"
    assert out[given + 1] == "mine"  # typed on the command line: left as typed


def test_the_rewrite_is_idempotent(tmp_path: Path) -> None:
    """Lightning's ddp launcher re-runs the rewritten command line through it in every rank."""
    config = write(tmp_path / "c" / "run.yaml", CONFIG)
    once = resolve_config_paths(["fit", "--config", str(config), "--trainer.max_steps", "2"], {})
    assert resolve_config_paths(once, {}) == once
    assert once[-2:] == ["--trainer.max_steps", "2"]


def test_configs_before_the_subcommand_and_inline_yaml_are_left_alone(tmp_path: Path) -> None:
    config = write(tmp_path / "c" / "run.yaml", {"fit": CONFIG})
    argv = ["--config", str(config), "fit", "--config", "{trainer: {max_steps: 1}}"]
    assert resolve_config_paths(argv, {}) == argv


def test_the_repository_configs_resolve_under_the_repository(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    for name in ("cpu_demo.yaml", "mixture.yaml"):
        got = options(resolve_config_paths(["fit", "--config", str(root / "configs" / name)], {}))
        work = got["trainer.default_root_dir"]
        assert os.path.isabs(work) and work.startswith(str(root / "results")), name
        for callback in got["trainer.callbacks"]:
            (path,) = (v for k, v in callback["init_args"].items() if k in ("directory", "dirpath"))
            assert path.startswith(work), name


def test_the_early_path_check_sees_the_resolved_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cli_checks.check_paths`` runs on the rewritten command line: a config's dataset and
    streams, relative to its root, exist wherever the command is run from."""
    from bcl_stream.errors import DatasetError
    from lightning_module.cli_checks import check_paths

    proj = tmp_path / "proj"
    for name in ("mds", "a", "b"):
        (proj / "data" / name).mkdir(parents=True)
    config = {
        "root": "..",
        "data": {"data": "data/mds", "eval": {"val_streams": ["data/a", {"path": "data/b"}]}},
    }
    argv = ["fit", "--config", str(write(proj / "configs" / "run.yaml", config))]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    check_paths(resolve_config_paths(argv, {}))
    with pytest.raises(DatasetError, match=r"data\.data: data/mds: no such dataset directory"):
        check_paths(argv)  # the same paths read against the current directory
