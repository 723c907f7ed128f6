"""``--world-size`` / ``--nodes`` / ``--ranks-per-node`` on ``plan``, ``read``, ``simulate`` and
``inspect`` (``bcl_stream/commands/layout_options.py``): torchrun's habit, one node of R ranks
unless told otherwise; the two split options checked against each other in one line; every
summary says the layout it assumed; and ``read`` for one 8-rank node yields exactly what rank 0
of that node's reader yields.

The datasets are WebDataset (no StreamingDataset in this process), the commands run through
``bcl_stream.cli.main`` in this process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bcl_stream.cli import build_parser, main
from bcl_stream.commands.layout_options import resolve_layout
from bcl_stream.process_layout import ProcessLayout

pytestmark = pytest.mark.shared_process

KNOBS = ["--pack-size", "2", "--window", "2"]


def layout_of(*argv: str) -> ProcessLayout:
    args = build_parser().parse_args(["plan", "D", *argv, *KNOBS])
    return resolve_layout(args)


@pytest.mark.parametrize(
    ("argv", "nodes", "per_node"),
    [
        (["--world-size", "8"], 1, 8),  # alone: one node of 8 (not 8 nodes of 1)
        (["--world-size", "8", "--nodes", "2"], 2, 4),
        (["--world-size", "8", "--ranks-per-node", "1"], 8, 1),  # the old meaning, spelled out
        (["--world-size", "8", "--nodes", "4", "--ranks-per-node", "2"], 4, 2),
        (["--nodes", "4", "--ranks-per-node", "8"], 4, 8),  # world = N x P
        (["--world-size", "1"], 1, 1),
    ],
)
def test_the_options_resolve_to_nodes_times_ranks(
    argv: list[str], nodes: int, per_node: int
) -> None:
    layout = layout_of(*argv)
    assert (layout.nodes, layout.ranks_per_node) == (nodes, per_node)
    assert layout.world_size == nodes * per_node


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--world-size", "8", "--nodes", "3"], "--world-size 8 is not a multiple of --nodes 3"),
        (
            ["--world-size", "8", "--nodes", "2", "--ranks-per-node", "2"],
            "--nodes 2 x --ranks-per-node 2 = 4 ranks, but --world-size is 8",
        ),
        (["--world-size", "6", "--ranks-per-node", "4"], "--ranks-per-node 4 does not divide"),
        (["--world-size", "8", "--nodes", "0"], "--nodes must be >= 1, got 0"),
        (["--nodes", "2"], "give --world-size R"),
        ([], "give --world-size R"),
    ],
)
def test_disagreeing_options_are_refused_naming_them(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("+", r"\+")):
        layout_of(*argv)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "DIR", *KNOBS],
        ["read", "DIR", "--rank", "0", *KNOBS],
        ["simulate", "--dataset", "DIR"],
        ["inspect", "DIR"],
    ],
)
def test_every_command_refuses_a_mismatch_in_one_line(
    wds_dir: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    flags = ["--world-size", "8", "--nodes", "2", "--ranks-per-node", "2"]
    if command[0] == "simulate":
        flags[0] = "--ranks"  # simulate's alias, named in its message
    argv = [str(wds_dir) if arg == "DIR" else arg for arg in command]
    code, out, err = run_cli(capsys, *argv, *flags)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"bcl-stream {command[0]}: error: --nodes 2 x --ranks-per-node 2 = 4 ranks" in line
    assert f"but {flags[0]} is 8" in line


def test_nodes_is_the_same_job_as_ranks_per_node_in_every_command(
    wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--nodes 2`` and ``--ranks-per-node 4`` of 8 ranks plan the same epoch in ``plan``,
    ``simulate`` and ``read``, and each summary (JSON and text) says 2 nodes x 4 ranks."""
    said = "2 nodes x 4 ranks (world 8)"
    by_nodes = ["--world-size", "8", "--nodes", "2", *KNOBS]
    by_per_node = ["--world-size", "8", "--ranks-per-node", "4", *KNOBS]
    plan = run_json(capsys, "plan", str(wds_dir), *by_nodes)
    assert plan == run_json(capsys, "plan", str(wds_dir), *by_per_node)
    expected = {"world_size": 8, "ranks_per_node": 4, "nodes": 2, "node_layout": said}
    assert {k: plan[k] for k in expected} == expected
    sim = run_json(capsys, "simulate", "--dataset", str(wds_dir), *by_nodes)
    assert {k: sim["config"][k] for k in ("nodes", "node_layout")} == {
        "nodes": 2,
        "node_layout": said,
    }
    assert (sim["config"]["ranks"], sim["config"]["ranks_per_node"]) == (8, 4)
    assert sim["strategies"]["bcl-node"]["efficiency"] == pytest.approx(plan["efficiency"])
    read = run_json(capsys, "read", str(wds_dir), *by_nodes, "--rank", "5")
    assert read["packs"] == plan["ranks"][5]["packs"]
    assert {k: read[k] for k in expected} == expected
    code, out, err = run_cli(capsys, "plan", str(wds_dir), *by_nodes)
    assert code == 0 and f"node layout: {said};" in out.splitlines()[0]
    code, out, _ = run_cli(capsys, "simulate", "--dataset", str(wds_dir), *by_nodes)
    assert code == 0 and f"node layout: {said};" in out.splitlines()[0]
    code, out, err = run_cli(capsys, "read", str(wds_dir), *by_nodes, "--rank", "5", "--packs", "1")
    assert code == 0 and len(out.splitlines()) == 1  # stdout: the packs only
    assert f"rank 5 of 8 (node 1): 1 packs of 2 records; node layout: {said}" in err
    code, out, _ = run_cli(capsys, "inspect", str(wds_dir), "--world-size", "8", "--nodes", "2")
    assert f"planned for node layout: {said}" in out


def test_simulate_takes_nodes_and_ranks_per_node_without_ranks(
    wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its default world (8 ranks) does not stand against an explicit N x P."""
    sim = run_json(
        capsys, "simulate", "--dataset", str(wds_dir), "--nodes", "2", "--ranks-per-node", "2",
        *KNOBS,
    )  # fmt: skip
    assert (sim["config"]["ranks"], sim["config"]["node_layout"]) == (
        4,
        "2 nodes x 2 ranks (world 4)",
    )
    default = run_json(capsys, "simulate", "--dataset", str(wds_dir), *KNOBS)
    assert default["config"]["node_layout"] == "1 node x 8 ranks (world 8)"


def test_read_for_one_8_rank_node_yields_what_rank_0_of_that_node_trains(
    wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``read --world-size 8 --rank 0`` (the README's one-node example) against the reader a
    training job on one node of 8 ranks builds for rank 0 (ranks per node 8, as the trainer
    reports it), read through the loader; and not what 8 nodes of one rank would read."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.wds_reader import WDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    read = run_json(capsys, "read", str(wds_dir), "--world-size", "8", "--rank", "0", *KNOBS)
    assert read["node_layout"] == "1 node x 8 ranks (world 8)"
    config = ReaderConfig.build(world_size=8, ranks_per_node=8, pack_size=2, window=2)
    loader = PackLoader(WDSPackDataset(str(wds_dir), config, 0))
    loader.set_epoch(0)
    trained = [[int(s["sample_id"]) for s in pack] for pack in loader]
    assert read["packs"] == trained and len(trained) > 5
    spread = run_json(
        capsys, "read", str(wds_dir), "--world-size", "8", "--ranks-per-node", "1", "--rank", "0",
        *KNOBS,
    )  # fmt: skip
    assert spread["packs"] != trained  # the layout decides the packs: the default matters
