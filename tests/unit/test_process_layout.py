"""ProcessLayout, the one type for a job's data-parallel rank, size and ranks per node: checked
once when built, and said in the same words by every summary."""

from __future__ import annotations

import pytest

from bcl_stream import PlanConfig, ProcessLayout


def test_nodes_and_node_follow_ranks_per_node() -> None:
    layout = ProcessLayout(rank=5, world_size=8, ranks_per_node=4)
    assert (layout.nodes, layout.node) == (2, 1)
    assert layout.local_processes == 4  # one process a data-parallel rank
    tp = ProcessLayout(rank=1, world_size=2, ranks_per_node=1, group_size=8, processes_per_node=8)
    assert (tp.nodes, tp.node, tp.local_processes) == (2, 1, 8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"world_size": 8, "ranks_per_node": 3}, "ranks_per_node=3 does not divide world_size=8"),
        ({"world_size": 4, "rank": 4}, r"rank must be in \[0, 4\), got 4"),
        ({"world_size": 0}, r"world_size must be in \[1, 1048576\], got 0"),
        ({"world_size": True}, "world_size must be an integer, got bool"),
        ({"world_size": 2, "rank": -1}, r"rank must be in \[0, 1048576\], got -1"),
        ({"world_size": 2, "group_size": 0}, r"group_size must be in \[1, 1048576\]"),
        ({"world_size": 2, "processes_per_node": 0}, r"processes_per_node must be in \[1,"),
    ],
)
def test_a_layout_that_cannot_be_is_refused_naming_the_value(
    fields: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ProcessLayout(**fields)


def test_the_two_texts_and_the_json() -> None:
    layout = ProcessLayout(world_size=8, ranks_per_node=4)
    assert layout.text() == "2 nodes x 4 ranks (world 8)"
    assert layout.ranks_text() == "8 ranks = 2 nodes x 4 ranks per node"
    one = ProcessLayout(world_size=1)
    assert one.text() == "1 node x 1 rank (world 1)"
    assert one.ranks_text() == "1 rank = 1 node x 1 rank per node"
    assert layout.to_json() == {
        "world_size": 8,
        "ranks_per_node": 4,
        "nodes": 2,
        "node_layout": "2 nodes x 4 ranks (world 8)",
    }


def test_of_plan_is_the_layout_a_planner_config_was_made_for() -> None:
    plan = PlanConfig(world_size=16, ranks_per_node=8)
    assert ProcessLayout.of_plan(plan, rank=9) == ProcessLayout(
        rank=9, world_size=16, ranks_per_node=8
    )
