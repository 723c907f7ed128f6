"""The test runner's grouping (``tools/run_tests.py``): every integration file runs in exactly
one group; the files marked ``shared_process`` are dealt into groups of about
``SHARED_GROUP_SECONDS`` or less by the last run's seconds (the longest groups bound the run's
wall), never fewer than the lanes; ``BCL_TEST_LANES`` sets the lane count or is refused."""

from __future__ import annotations

import pytest

from tools import run_tests


def shared_files() -> list[str]:
    return [
        g for group in run_tests.find_groups({}, 2) if "shared" in group.name for g in group.paths
    ]


def test_every_integration_file_runs_in_exactly_one_group() -> None:
    groups = run_tests.find_groups({}, 2)
    paths = [p for g in groups for p in g.paths]
    files = sorted(
        str(p.relative_to(run_tests.ROOT))
        for p in run_tests.ROOT.glob("tests/integration/test_*.py")
    )
    assert sorted(p for p in paths if p != "tests/unit") == files
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize("each", [10.0, 100.0, 400.0])
def test_shared_files_are_dealt_into_groups_of_bounded_seconds(each: float) -> None:
    names = shared_files()
    assert len(names) > 4  # else nothing is dealt
    seconds = {name: each for name in names}
    groups = [g for g in run_tests.find_groups(seconds, 2) if "shared" in g.name]
    total = each * len(names)
    assert sorted(p for g in groups for p in g.paths) == sorted(names)
    assert len(groups) >= 2
    for group in groups:  # longest first onto the lightest: at most one file past the bound
        assert (
            len(group.paths) == 1
            or each * len(group.paths) <= max(run_tests.SHARED_GROUP_SECONDS, total / 2) + each
        )
    if total <= 2 * run_tests.SHARED_GROUP_SECONDS:
        assert len(groups) == 2  # a group more costs an interpreter start


def test_lanes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BCL_TEST_LANES", "3")
    assert run_tests.lanes() == 3
    monkeypatch.delenv("BCL_TEST_LANES")
    assert 1 <= run_tests.lanes() <= run_tests.MAX_LANES
    for bad in ("0", "x", str(run_tests.MAX_LANES + 1)):
        monkeypatch.setenv("BCL_TEST_LANES", bad)
        with pytest.raises(SystemExit, match="BCL_TEST_LANES"):
            run_tests.lanes()
