"""``python -m tools.gpu_check --cpu-tiny`` runs the GPU check's own code end to end on the CPU and
writes a JSON whose figures hang together; a budget too small stops it cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_process import run_module

from bcl_stream.analysis.sim import STRATEGIES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), pytest.mark.shared_process]

ROOT = Path(__file__).resolve().parents[2]


def run_check(out: Path, *extra: str, fresh: bool = True) -> tuple[int, dict[str, Any], str]:
    """``fresh``: as on the device machine, a new interpreter from the checkout's root with
    nothing on PYTHONPATH (what the check finds imported is part of its result). Otherwise
    forked from the tests' pre-imported server (tests/cli_process.py), for a run whose
    assertions do not depend on what is imported."""
    args = ("--cpu-tiny", "--out", str(out), *extra)
    if fresh:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [sys.executable, "-m", "tools.gpu_check", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=360,
        )
    else:
        proc = run_module("tools.gpu_check", *args, cwd=ROOT, timeout=360)
    path = out / "gpu_check_cpu_tiny.json"
    assert path.exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads(path.read_text()), proc.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str, Path]:
    out = tmp_path_factory.mktemp("gpu")
    return (*run_check(out), out)


def test_cpu_tiny_completes_with_progress_lines_and_a_png(tiny: Any) -> None:
    code, result, stdout, out = tiny
    assert code == 0, stdout
    assert result["complete"] is True and result["stopped"] is None
    assert result["mode"] == "cpu-tiny"
    assert sum(line.startswith("[gpu_check") for line in stdout.splitlines()) >= 5
    assert (out / "gpu_check_cpu_tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_planner_cost_and_sim_import_nothing_heavy(tiny: Any) -> None:
    result = tiny[1]
    assert {"streaming", "webdataset", "boto3"} <= set(result["imports"]["checked"])
    assert result["imports"]["loaded_by_bcl_stream"] == []


def test_attention_backend_and_calibration_are_recorded(tiny: Any) -> None:
    result = tiny[1]
    packed = result["attention"]["packed"]
    assert packed["backend"] == "segments" and packed["why"]  # no varlen kernel on a CPU
    for layout in ("packed", "padded"):
        cal = result["calibration"][layout]
        assert cal["packs_timed"] == cal["packs_designed"] == result["config"]["calib_packs"]
        assert all(len(p["seconds"]) == result["config"]["repeats"] for p in cal["packs"])
        assert min(cal["fit"][c] for c in ("a", "b", "k")) >= 0 and cal["fit"]["unit"] == "seconds"
        assert isinstance(cal["r2_holdout"], float) and cal["fixed_pack_s"] > 0


def test_strategies_are_looked_up_in_the_simulator(tiny: Any) -> None:
    strategies = tiny[1]["strategies"]
    assert set(strategies["run"]) <= set(STRATEGIES)
    assert {"sequential", "bcl-rank", "bcl-world"} <= set(strategies["run"])
    for name in strategies["missing"]:
        assert not set(name.split("/")) & set(STRATEGIES)
    assert set(tiny[1]["layouts"]["packed"]) == set(strategies["run"])


def test_every_strategy_measured_on_the_same_records_and_scored_consistently(tiny: Any) -> None:
    result = tiny[1]
    cfg, plan = result["config"], result["plan"]
    assert plan["records"] == cfg["ranks"] * cfg["pack_size"] * plan["steps"]
    for layout, rows in result["layouts"].items():
        for name, row in rows.items():
            assert row["records"] == plan["records"], (layout, name)
            if name == "sequential" or name.startswith("bcl-"):
                assert row["steps"] == plan["steps"], (layout, name)
                if not name.endswith("+step"):  # contract="step": sizes vary, G*B per step
                    assert row["pack_sizes"] == [cfg["pack_size"]], (layout, name)
            assert row["imbalance_sq"] >= 1.0
            assert 0 < row["measured_efficiency"] <= 1 + 1e-9, (layout, name)
            assert 0 < row["predicted_efficiency"] <= 1 + 1e-9, (layout, name)
            assert row["measured_time_s"] == pytest.approx(sum(row["step_times_s"]))
            seq = rows["sequential"]
            assert row["measured_speedup_vs_sequential"] == pytest.approx(
                seq["measured_time_s"] / row["measured_time_s"]
            )
        assert rows["sequential"]["measured_speedup_vs_sequential"] == pytest.approx(1.0)


def test_padding_waste_by_layout(tiny: Any) -> None:
    layouts = tiny[1]["layouts"]
    assert all(row["padding_waste_tokens"] == 0.0 for row in layouts["packed"].values())
    padded = layouts["padded"]
    assert 0 < padded["sequential"]["padding_waste_tokens"] < 1
    # BCL groups similar lengths for the padded layout (planner/padded.py).
    for scope in ("bcl-rank", "bcl-world"):
        assert padded[scope]["padding_waste_tokens"] < padded["sequential"]["padding_waste_tokens"]
    for row in padded.values():
        assert row["measured_speedup_vs_sequential_packed"] > 0


def test_a_budget_too_small_stops_cleanly_and_still_writes(tmp_path: Path) -> None:
    code, result, stdout = run_check(tmp_path, "--budget-s", "1", fresh=False)
    assert code == 2
    assert result["complete"] is False and "budget" in result["stopped"]
    assert result["model"]["parameters"] > 0 and "environment" in result
    assert "stopped early" in stdout
