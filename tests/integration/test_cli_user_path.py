"""The command line as a new user meets it: real ``python -m bcl_stream.cli`` processes.

Each test names the point of the "user's path" issue it checks: a directory that is not a
dataset (3), ``simulate --dataset`` (5), the stored preprocess report (6), WebDataset scopes
(7), a pack size larger than the data (8), ``--skip-bad`` on an empty file (10), help,
defaults, ``--version``, ``--debug`` and ``BCL_STREAM_DEBUG`` (11). Remote faults are in ``test_cli_s3_errors.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_process import bcl_stream_cli

pytestmark = pytest.mark.slow

PLAN = ["--world-size", "2", "--pack-size", "4", "--window", "4"]


def cli(
    *args: str, cwd: Path | None = None, debug_env: bool = False
) -> subprocess.CompletedProcess[str]:
    """``bcl-stream ARGS``; ``debug_env`` sets ``BCL_STREAM_DEBUG=1`` (else it is unset)."""
    env = {k: v for k, v in os.environ.items() if k != "BCL_STREAM_DEBUG"}
    if debug_env:
        env["BCL_STREAM_DEBUG"] = "1"
    return bcl_stream_cli(*args, env=env, cwd=cwd)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (exit 2), no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "error:" in lines[0]
    return lines[0]


@pytest.fixture
def not_a_dataset(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "readme.txt").write_text("not a dataset")
    return root


@pytest.mark.parametrize(
    "command",
    [
        ["plan", *PLAN],
        ["read", *PLAN, "--rank", "0"],
        ["annotate", "--no-progress"],
        ["simulate", "--dataset"],
    ],
)
def test_not_a_dataset_says_so_without_a_wrong_hint(
    command: list[str], not_a_dataset: Path
) -> None:
    if command[0] == "simulate":
        args = [*command, str(not_a_dataset), "--ranks", "2"]
    else:
        args = [command[0], str(not_a_dataset), *command[1:]]
    line = one_error(cli(*args))
    assert f"{not_a_dataset}: not a dataset" in line
    assert "annotate" not in line.split("error:", 1)[1]  # annotate cannot help here


def test_inspect_gives_the_verdict_only(not_a_dataset: Path) -> None:
    proc = cli("inspect", str(not_a_dataset))
    assert proc.returncode == 1
    assert "0 records" not in proc.stdout and "None" not in proc.stdout
    assert "integrity: PROBLEMS" in proc.stdout and "not a dataset" in proc.stdout


def test_datamodule_on_a_directory_that_is_not_a_dataset(not_a_dataset: Path) -> None:
    from bcl_stream.errors import DatasetError
    from lightning_module import BCLDataModule

    with pytest.raises(DatasetError, match="not a dataset") as info:
        BCLDataModule(str(not_a_dataset), plan={"pack_size": 2, "window": 2}).setup()
    assert "index.json" not in str(info.value).split("not a dataset")[0]


def test_complete_mds_without_cost_index_is_told_to_annotate(mds_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "plain"
    shutil.copytree(mds_dir, copy)
    for name in ("bcl_index.json", "bcl_costs.npy"):
        (copy / name).unlink()
    line = one_error(cli("plan", str(copy), *PLAN))
    assert f"`bcl-stream annotate {copy}`" in line


def test_simulate_lengths_takes_a_cost_array(mds_dir: Path, tmp_path: Path) -> None:
    """``--lengths`` takes a dataset's ``bcl_costs.npy`` as it is, or a plain array of lengths
    (``simulate --dataset`` uses the real shards instead: ``test_cli_defaults.py``)."""
    common = ["--ranks", "2", "--pack-size", "4", "--window", "4", "--json"]
    costs = mds_dir / "bcl_costs.npy"
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.load(costs)["tokens"].astype(np.int64))
    got = [
        cli("simulate", "--lengths", str(source), *common, "--cost-model", "tokens")
        for source in (costs, lengths)
    ]
    assert all(proc.returncode == 0 for proc in got), got[0].stderr
    assert json.loads(got[0].stdout) == json.loads(got[1].stdout)
    assert "--lengths FILE.npy" in cli("simulate", "--help").stdout


def test_preprocess_names_an_empty_input_and_reports_it_when_skipped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = [json.dumps({"text": f"record {i} " * (5 + i % 40)}) for i in range(300)]
    (data / "a.jsonl").write_text("\n".join(lines) + "\n")
    (data / "b.jsonl").write_text("")  # what a glob such as data/*.jsonl may catch
    inputs = [str(data / "a.jsonl"), str(data / "b.jsonl")]
    opts = ["--no-progress", "--workers", "1", "--shard-size-limit", "4kb"]
    line = one_error(cli("preprocess", *inputs, "--output", str(tmp_path / "x"), *opts))
    assert "b.jsonl: empty input" in line and "--skip-bad" in line

    out = tmp_path / "out"
    proc = cli("preprocess", *inputs, "--output", str(out), *opts, "--skip-bad", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["empty_inputs"] == [str(data / "b.jsonl")]
    stored = json.loads((out / "bcl_index.json").read_text())
    assert report["shards"] == len(stored["shards"]) > 1
    assert stored["extra"]["preprocess"]["shards"] == report["shards"]


def test_wds_plans_and_reads_every_scope(wds_dir: Path) -> None:
    """WebDataset reads by byte range (a member index per tar), so every scope is served: the
    reader's packs at scope world are the plan's."""
    planned = cli("plan", str(wds_dir), *PLAN, "--scope", "world", "--json")
    assert planned.returncode == 0, planned.stderr[-2000:]
    read = cli("read", str(wds_dir), *PLAN, "--scope", "world", "--rank", "0", "--json")
    assert read.returncode == 0, read.stderr[-2000:]
    want = json.loads(planned.stdout)["ranks"][0]["packs"]
    assert json.loads(read.stdout)["packs"] == want


def test_pack_size_larger_than_the_data_is_one_error_line(mds_dir: Path) -> None:
    big = ["--world-size", "2", "--pack-size", "400", "--window", "2"]
    for command in (["plan"], ["read", "--rank", "0"]):
        line = one_error(cli(command[0], str(mds_dir), *big, *command[1:]))
        assert "no pack for any rank" in line and "300 records" in line
        assert "needs at least 800" in line


def test_help_shows_every_option_with_its_default() -> None:
    from bcl_stream.cli import COMMANDS, build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    assert set(subparsers) == set(COMMANDS)
    for name, sub in subparsers.items():
        for action in sub._actions:
            assert action.help, f"bcl-stream {name} {action.option_strings or action.dest}: no help"
    text = cli("plan", "--help").stdout
    assert "--seed SEED" in text and "(default: 0)" in text and "(default: node)" in text
    assert "usage: bcl-stream plan" in text


def test_version_and_debug_keeps_the_cause_chain(tmp_path: Path) -> None:
    from bcl_stream.cli import version

    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"bcl-stream {version()}"
    bad = tmp_path / "lengths.npy"
    bad.write_text("not an array")
    one_error(cli("simulate", "--lengths", str(bad)))
    debug = cli("--debug", "simulate", "--lengths", str(bad))
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr and "direct cause" in debug.stderr  # the chain is kept
    assert debug.stderr.strip().splitlines()[-1].startswith("bcl-stream simulate: error:")


@pytest.mark.parametrize("broken", ["index.json", "cost model"])
def test_debug_and_env_show_the_original_cause(broken: str, mds_dir: Path, tmp_path: Path) -> None:
    """A corrupt file: one line by default; with ``--debug`` or ``BCL_STREAM_DEBUG=1`` the
    traceback names the JSON error our message was raised from, then the same line."""
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(mds_dir, copy)
    if broken == "index.json":
        (copy / "index.json").write_text('{"version": 2, "shards": [')
        args = ["annotate", str(copy), "--no-progress", "--overwrite"]
        expected = "unreadable index.json"
    else:
        (tmp_path / "model.json").write_text('{"name": "mine", "a": ')
        args = ["plan", str(copy), *PLAN, "--cost-model", str(tmp_path / "model.json")]
        expected = "cannot read cost model"
    line = one_error(cli(*args))
    assert expected in line
    for proc in (cli("--debug", *args), cli(*args, debug_env=True)):
        assert proc.returncode == 2, proc.stderr[-3000:]
        cause, _, effect = proc.stderr.partition("direct cause of the following exception")
        assert "json.decoder.JSONDecodeError" in cause, proc.stderr[-3000:]  # the original
        assert "Traceback" in effect and expected in effect
        assert proc.stderr.strip().splitlines()[-1] == line
