"""Usage errors are reported before the heavy imports (issue "the user's path, second pass",
point 8: ``read --rank 2 --world-size 2`` took 6.6 s to say so, a missing data path under
``python -m lightning_module`` ~16 s, after the DDP launch).

Each case runs the real entry point in a fresh interpreter and reports, after the error, which
of torch, streaming, Lightning and transformers were imported: none may be (they are what
costs the seconds). The time itself is measured by ``tools/bench_cli_startup.py`` (target
<= 1 s), not asserted here. Also: a failed preprocess leaves no empty output behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_process import python_process

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "streaming", "lightning", "transformers")
PLAN = ["--world-size", "2", "--pack-size", "4", "--window", "4"]

PROBE = """
import contextlib, io, json, sys
from {module} import {function} as entry
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
        code = entry({argv!r})
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print(json.dumps({{"code": code, "stderr": err.getvalue(), "heavy": heavy}}))
"""


def probe(module: str, function: str, argv: list[str]) -> dict:  # type: ignore[type-arg]
    proc = python_process(PROBE.format(module=module, function=function, argv=argv, heavy=HEAVY))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[type-arg]
    return result


def cases(data: Path, tmp: Path) -> dict[str, tuple[str, str, list[str], str]]:
    jsonl = tmp / "a.jsonl"
    jsonl.write_text('{"text": "a"}\n')
    cli = ("bcl_stream.cli", "main")
    fit = ("lightning_module.__main__", "run")
    config = str(ROOT / "configs" / "cpu_demo.yaml")
    return {
        "read_bad_rank": (
            *cli,
            ["read", str(data), *PLAN, "--rank", "2"],
            "--rank must be in [0, 2)",
        ),
        "read_negative": (*cli, ["read", str(data), *PLAN, "--rank", "0", "--packs", "-1"], ">= 0"),
        "read_no_pack": (
            *cli,
            [
                "read",
                str(data),
                "--world-size",
                "2",
                "--pack-size",
                "400",
                "--window",
                "1",
                "--rank",
                "0",
            ],
            "no pack for any rank",
        ),
        "read_missing": (*cli, ["read", str(tmp / "nope"), *PLAN, "--rank", "0"], "no such"),
        "preprocess_existing": (
            *cli,
            ["preprocess", str(jsonl), "--output", str(data)],
            "already exists",
        ),
        "preprocess_missing_input": (
            *cli,
            ["preprocess", str(tmp / "x.jsonl"), "--output", str(tmp / "o")],
            "no such input",
        ),
        "annotate_missing": (*cli, ["annotate", str(tmp / "nope")], "no such dataset directory"),
        "fit_missing_data": (
            *fit,
            ["fit", "--config", config, "--data.data", str(tmp / "nope")],
            "no such dataset directory",
        ),
        "fit_missing_ckpt": (
            *fit,
            [
                "fit",
                "--config",
                config,
                "--data.data",
                str(data),
                "--ckpt_path",
                str(tmp / "gone.ckpt"),
            ],
            "no such checkpoint",
        ),
        "fit_missing_model": (
            *fit,
            [
                "fit",
                "--config",
                str(ROOT / "configs" / "h200_node.yaml"),
                "--data.data",
                str(data),
                "--model.model",
                str(tmp / "no-model"),
            ],
            "no config.json",
        ),
    }


@pytest.mark.parametrize(
    "name",
    [
        "read_bad_rank",
        "read_negative",
        "read_no_pack",
        "read_missing",
        "preprocess_existing",
        "preprocess_missing_input",
        "annotate_missing",
        "fit_missing_data",
        "fit_missing_ckpt",
        "fit_missing_model",
    ],
)
def test_usage_error_before_heavy_imports(name: str, mds_dir: Path, tmp_path: Path) -> None:
    module, function, argv, expected = cases(mds_dir, tmp_path)[name]
    result = probe(module, function, argv)
    assert result["code"] == 2, result
    lines = result["stderr"].strip().splitlines()
    assert lines and expected in lines[-1], result["stderr"][-2000:]
    assert "Traceback" not in result["stderr"]
    assert result["heavy"] == [], f"{name} imported {result['heavy']} before its error"


def test_the_probe_sees_heavy_imports(mds_dir: Path) -> None:
    """The probe can fail: a successful ``read`` does import torch and streaming."""
    result = probe("bcl_stream.cli", "main", ["read", str(mds_dir), *PLAN, "--rank", "0"])
    assert result["code"] == 0 and {"torch", "streaming"} <= set(result["heavy"])


def test_failed_preprocess_leaves_no_empty_output(tmp_path: Path) -> None:
    from cli_process import bcl_stream_cli

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "unterminated\n')
    out = tmp_path / "out"
    proc = bcl_stream_cli("preprocess", str(bad), "--output", str(out), "--no-progress")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "bad.jsonl:2: malformed JSON at column" in line and "at at" not in line
    assert not out.exists()  # nothing written, nothing left for inspect to puzzle over
    out.mkdir()
    inspect = bcl_stream_cli("inspect", str(out))
    assert inspect.returncode == 1 and "an empty directory, not a dataset" in inspect.stdout


def test_a_malicious_checkpoint_is_refused_in_one_line(mds_dir: Path, tmp_path: Path) -> None:
    """Resuming from a checkpoint whose pickle would run code: torch's safe loader refuses it,
    and the user reads one line naming the file and what to do (exit 2), not torch's
    traceback; ``--debug`` shows the chained cause."""
    import torch
    from cli_process import run_module
    from hostile_pickle import RunsCode

    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": RunsCode(marker)}}, evil)
    argv = [
        "fit",
        "--config",
        str(ROOT / "configs" / "cpu_demo.yaml"),
        "--data.data",
        str(mds_dir),
        "--trainer.devices",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--trainer.callbacks.0.init_args.directory",
        str(tmp_path / "logs"),
        "--ckpt_path",
        str(evil),
    ]
    proc = run_module("lightning_module", *argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"python -m lightning_module: error: --ckpt_path {evil}: refused")
    assert "unsupported GLOBAL posix.mkdir" in line and "last_complete_checkpoint" in line
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    debug = run_module("lightning_module", "--debug", *argv)
    assert debug.returncode == 2 and "UnpicklingError" in debug.stderr
    assert "Traceback" in debug.stderr and not marker.exists()
