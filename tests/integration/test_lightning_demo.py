"""The demo's resume verdict and audits must be able to say "no" (pure helpers, no training)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tools import demo as demo_tool

pytestmark = pytest.mark.shared_process


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    return demo_tool


def logs(n: int, ranks: int = 2, offset: int = 0) -> list[list[dict[str, Any]]]:
    return [
        [
            {"step": t, "sample_ids": [1000 * r + 2 * t, 1000 * r + 2 * t + 1], "est_cost": 1.0}
            for t in range(offset, n)
        ]
        for r in range(ranks)
    ]


def test_compare_resume_accepts_identical_split(demo: ModuleType) -> None:
    full = logs(10)
    first = [rank[:4] for rank in full]
    second = [rank[4:] for rank in full]
    out = demo.compare_resume(full, [first, second])
    assert out == {"identical": True, "steps_compared": 20, "first_mismatch": None}


def test_compare_resume_finds_a_changed_pack(demo: ModuleType) -> None:
    full = logs(10)
    second = [[dict(x) for x in rank[4:]] for rank in full]
    second[1][2]["sample_ids"] = [7, 8]
    out = demo.compare_resume(full, [[rank[:4] for rank in full], second])
    assert out["identical"] is False
    assert out["first_mismatch"]["rank"] == 1 and out["first_mismatch"]["index"] == 6


def test_compare_resume_finds_a_skipped_pack(demo: ModuleType) -> None:
    full = logs(10)
    out = demo.compare_resume(full, [[rank[:4] for rank in full], [rank[5:] for rank in full]])
    assert out["identical"] is False and out["first_mismatch"]["rank"] == 0


def test_audit_counts_duplicates_and_packs(demo: ModuleType) -> None:
    good = logs(5)
    assert demo.audit(good) == {"packs_per_rank": [5, 5], "records": 20, "duplicates": 0}
    bad = logs(5)
    bad[1][0]["sample_ids"] = list(bad[0][0]["sample_ids"])
    assert demo.audit(bad)["duplicates"] == 2


def test_matrix_refuses_ranks_with_different_steps(demo: ModuleType) -> None:
    uneven = logs(5)
    uneven[1].pop()
    with pytest.raises(SystemExit, match="different steps"):
        demo.matrix(uneven, "est_cost")
