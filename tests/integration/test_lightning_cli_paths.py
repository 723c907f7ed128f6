"""The demo config through the real LightningCLI (``python -m lightning_module``): relative
paths land under the config's root whatever the current directory, ``--root`` and
``$BCL_STREAM_ROOT`` move them, and one callback's argument is set by its index
(``--trainer.callbacks.0.init_args.directory X``, which jsonargparse alone refuses).

The config is ``configs/cpu_demo.yaml`` itself, with the tiny model, one CPU device and two
steps, copied into a project directory beside a small dataset it names relatively.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_process import run_module
from lightning_scripts.harness import tiny_config

from lightning_module.__main__ import run
from lightning_module.callbacks import read_pack_log
from lightning_module.config_paths import ROOT_ENV

pytestmark = pytest.mark.shared_process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory, dataset_writers: tuple[Callable[..., None], ...]
) -> Path:
    """``proj/configs/demo.yaml`` (the demo config: ``root: ..``, its relative paths) and the
    dataset it names, ``proj/data/mds``."""
    proj = tmp_path_factory.mktemp("proj")
    dataset_writers[0](proj / "data" / "mds", 64)
    cfg = yaml.safe_load((ROOT / "configs" / "cpu_demo.yaml").read_text())
    assert cfg["root"] == ".."
    cfg["trainer"].update(
        devices=1, strategy="auto", max_steps=2, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    cfg["trainer"]["callbacks"][1]["init_args"]["every_n_train_steps"] = 1
    tiny = tiny_config()
    keys = ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len")
    cfg["model"]["init_args"]["config"].update({k: getattr(tiny, k) for k in keys})
    cfg["data"]["data"] = "data/mds"
    cfg["data"]["plan"].update(pack_size=2, window=2)
    (proj / "configs").mkdir()
    (proj / "configs" / "demo.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return proj


def printed_config(*args: str) -> dict[str, Any]:
    """``fit ARGS --print_config`` in this process: the config LightningCLI would run."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        run(["fit", *args, "--print_config"])
    assert done.value.code in (0, None), out.getvalue()[-2000:]
    config: dict[str, Any] = yaml.safe_load(out.getvalue())
    return config


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory, no root in the environment, streaming's memory kept."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.setenv("BCL_STREAM_KEEP_SHM", "1")
    return tmp_path


def test_fit_from_another_directory_writes_under_the_config_root(
    project: Path, elsewhere: Path
) -> None:
    """A real two-step fit, launched elsewhere: checkpoints and the saved config under the
    project, the pack log where the command line's (relative) override put it, nothing else in
    the current directory."""
    config = project / "configs" / "demo.yaml"
    proc = run_module(
        "lightning_module", "fit", "--config", str(config),
        "--trainer.callbacks.0.init_args.directory", "my_logs",
        env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=elsewhere, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["my_logs"]
    lines = read_pack_log(elsewhere / "my_logs" / "packs_rank0.jsonl")
    assert [line["step"] for line in lines] == [0, 1]
    work = project / "results" / "demo" / "work"
    assert sorted(p.name for p in (work / "ckpt").iterdir()) == [
        "epoch=0-step=1.ckpt",
        "epoch=0-step=2.ckpt",
        "last.ckpt",
    ]
    saved = yaml.safe_load((work / "config.yaml").read_text())
    assert saved["data"]["data"] == str(project / "data" / "mds")
    assert saved["trainer"]["default_root_dir"] == str(work)
    assert not (project / "results" / "demo" / "work" / "logs").exists()  # overridden


def test_root_option_and_environment_move_the_config_paths(
    project: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = str(project / "configs" / "demo.yaml")
    other = elsewhere / "other"
    (other / "data").mkdir(parents=True)
    (other / "data" / "mds").symlink_to(project / "data" / "mds")
    by_option = printed_config("--config", config, "--root", str(other))
    assert by_option["trainer"]["default_root_dir"] == str(other / "results" / "demo" / "work")
    assert by_option["data"]["data"] == str(other / "data" / "mds")
    monkeypatch.setenv(ROOT_ENV, str(other))
    by_env = printed_config("--config", config)
    assert by_env["trainer"]["callbacks"] == by_option["trainer"]["callbacks"]
    directory = by_env["trainer"]["callbacks"][0]["init_args"]["directory"]
    assert directory == str(other / "results" / "demo" / "work" / "logs")
    typed = printed_config("--config", config, "--trainer.default_root_dir", "here")
    assert typed["trainer"]["default_root_dir"] == "here"  # typed: the current directory's


def test_one_callback_argument_by_its_index(project: Path, elsewhere: Path) -> None:
    """Set on the N-th callback only, typed as jsonargparse types it (an int stays an int;
    a value of the wrong type is still refused)."""
    config = str(project / "configs" / "demo.yaml")
    got = printed_config(
        "--config", config, "--trainer.callbacks.1.init_args.every_n_train_steps", "5",
        "--trainer.callbacks.0.init_args.directory=logs2",
    )  # fmt: skip
    logger, checkpoint = got["trainer"]["callbacks"]
    assert (
        logger["class_path"].endswith("PackLogger") and logger["init_args"]["directory"] == "logs2"
    )
    assert checkpoint["init_args"]["every_n_train_steps"] == 5
    assert checkpoint["init_args"]["dirpath"] == str(project / "results" / "demo" / "work" / "ckpt")
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as bad:
        run(["fit", "--config", config, "--trainer.callbacks.1.init_args.every_n_train_steps", "x"])
    assert bad.value.code == 2


def test_an_index_past_the_list_is_one_line(
    project: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(project / "configs" / "demo.yaml")
    assert run(["fit", "--config", config, "--trainer.callbacks.7.init_args.directory", "x"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--trainer.callbacks.7.init_args.directory: the config gives 2 callbacks" in line
