"""The benchmarks' harness: every result file carries the same machine stamp, is written in one
form and drawn from what was written; a one-core child runs this checkout with thread pools of
one; the parser gives every benchmark the same ``--out`` and ``--quick``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bcl_bench import harness

STAMP_KEYS = {
    "cpu_model",
    "cpu_count",
    "cpus_usable",
    "load_average",
    "python",
    "numpy",
    "torch",
    "git_commit",
    "git_uncommitted_changes",
    "date",
}


def test_machine_stamp_has_one_set_of_keys_with_real_values() -> None:
    stamp = harness.machine_stamp()
    assert set(stamp) == STAMP_KEYS
    assert stamp["cpu_count"] == os.cpu_count() and 1 <= stamp["cpus_usable"] <= stamp["cpu_count"]
    assert len(stamp["load_average"]) == 3
    assert stamp["numpy"] == np.__version__
    assert stamp["python"] == ".".join(map(str, sys.version_info[:3]))
    assert stamp["date"].endswith("Z") and stamp["date"][:2] == "20"
    # None only where git or the repository is missing (a copied working tree).
    assert stamp["git_commit"] is None or len(stamp["git_commit"]) == 40


def test_write_result_stamps_writes_one_form_and_plots_what_it_wrote(tmp_path: Path) -> None:
    drawn: list[tuple[dict[str, Any], Path]] = []
    out = tmp_path / "deeper" / "bench.json"
    result = {"rows": [{"efficiency": np.float32(0.5), "packs": np.int64(3)}]}
    written = harness.write_result(result, out, lambda r, png: drawn.append((r, png)))
    text = out.read_text()
    assert text.endswith("}\n") and text.startswith('{\n "rows"')  # indent 1, final newline
    loaded = json.loads(text)
    assert loaded == written
    assert set(loaded["machine"]) == STAMP_KEYS
    assert loaded["rows"] == [{"efficiency": 0.5, "packs": 3}]
    assert isinstance(loaded["rows"][0]["packs"], int)
    assert drawn == [(written, out.with_suffix(".png"))]
    assert "machine" not in result  # the caller's dict is left alone


def test_write_result_keeps_a_stamp_taken_earlier(tmp_path: Path) -> None:
    earlier = {**harness.machine_stamp(), "load_average": [9.0, 9.0, 9.0]}
    written = harness.write_result({"x": 1}, tmp_path / "r.json", machine=earlier)
    assert written["machine"]["load_average"] == [9.0, 9.0, 9.0]


def test_write_result_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        harness.write_result({"x": {1, 2}}, tmp_path / "r.json")


def test_one_core_child_gets_this_checkout_and_one_thread(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        "import json, os, bcl_bench\n"
        "print('noise first')\n"
        "print(json.dumps({'threads': os.environ['OMP_NUM_THREADS'], "
        "'bcl_bench': bcl_bench.__file__, 'argv': __import__('sys').argv[1:]}))\n"
    )
    row = harness.run_on_one_core([str(script), "a", "b"])
    assert row["threads"] == "1"
    assert Path(row["bcl_bench"]).resolve().parent == harness.ROOT / "bcl_bench"
    assert row["argv"] == ["a", "b"]


def test_parser_gives_out_and_quick_alike() -> None:
    doc = "First paragraph.\n\nDetails nobody needs in --help."
    parser = harness.bench_parser(doc, harness.RESULTS / "x.json", quick="fewer records")
    args = parser.parse_args([])
    assert args.out == harness.RESULTS / "x.json" and args.quick is False
    assert parser.description == "First paragraph."
    args = parser.parse_args(["--out", "elsewhere.json", "--quick"])
    assert args.out == Path("elsewhere.json") and args.quick is True
    plain = harness.bench_parser(doc, harness.RESULTS / "x.json")
    with pytest.raises(SystemExit):
        plain.parse_args(["--quick"])
