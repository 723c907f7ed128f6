"""ReaderConfig.build inside a process group: the world size from the group and, where the
launcher says it (torchrun's LOCAL_WORLD_SIZE), the ranks per node too; explicit values win.
(The real 2-process gloo group is tests/integration/test_gloo_readers.py; here the group is
stood in for, to reach the layouts two local processes cannot make.)"""

from __future__ import annotations

import pytest

from bcl_stream import ReaderConfig
from bcl_stream.epoch import plan as plan_module
from bcl_stream.process_layout import ProcessLayout


@pytest.fixture
def group_of_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "process_group", lambda: ProcessLayout(rank=3, world_size=8))


def build(**kw: int) -> ReaderConfig:
    return ReaderConfig.build(pack_size=4, window=2, **kw)


def test_torchrun_node_is_one_node_of_its_local_ranks(
    group_of_eight: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    plan = build().plan
    assert (plan.world_size, plan.ranks_per_node) == (8, 4)


def test_without_a_launcher_value_ranks_per_node_keeps_its_default(
    group_of_eight: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    plan = build().plan
    assert (plan.world_size, plan.ranks_per_node) == (8, 1)


def test_explicit_values_win_over_group_and_launcher(
    group_of_eight: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert build(ranks_per_node=2).plan.ranks_per_node == 2
    # an explicit world size is the user's data-parallel layout: the launcher's count of
    # processes per node says nothing about it (tensor parallelism), so it is not applied
    assert build(world_size=2).plan.ranks_per_node == 1


@pytest.mark.parametrize("value", ["3", "0", "eight"])
def test_a_launcher_value_that_cannot_be_the_layout_is_refused(
    group_of_eight: None, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    with pytest.raises(
        ValueError, match=rf"LOCAL_WORLD_SIZE='{value}' does not divide .* 8: give ranks_per_node"
    ):
        build()
