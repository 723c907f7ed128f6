"""The ``multipack`` peer reproduces the multipack sampler exactly, and keeps its invariants.

Fidelity: ``fixtures/multipack_upstream.json`` holds fixed inputs and what the upstream
``MultipackDistributedBatchSampler`` yielded on every rank for them (``tools/multipack_fixtures.py``,
run once at the revision ``peers/multipack.py`` follows). Upstream sorts with numba's
``np.argsort``, whose quicksort orders records of equal length differently from numpy's; so
the check is exact up to that: every rank's t-th micro-batch holds records of the same lengths
as upstream's (hence the same tokens and cost), the same records are used and left out, and
where no two records of an allocation tie, the very same records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pack_oracles import check_every_record_once
from upstream_fixtures import upstream

from bcl_stream.peers import PEERS, Pool
from bcl_stream.peers.multipack import MULTIPACK_REVISION, allocate, ffd_check, multipack

UPSTREAM = upstream("multipack")


def test_fixtures_come_from_the_revision_the_module_follows() -> None:
    assert UPSTREAM["multipack_revision"] == MULTIPACK_REVISION
    assert PEERS["multipack"].pooled is False


@pytest.mark.parametrize("case", UPSTREAM["cases"], ids=lambda c: f"{c['kind']}-{c['world_size']}")
def test_every_rank_yields_what_the_upstream_sampler_yields(case: dict[str, Any]) -> None:
    tokens = np.array(case["lengths"])
    pool = Pool(np.array(case["order"]), tokens, case["world_size"], 1, 1)
    bins, remainder = multipack(pool, case["capacity"])
    ours = [[b.tolist() for b in rank] for rank in bins]
    theirs = case["ranks"]
    assert [len(rank) for rank in ours] == [len(rank) for rank in theirs]
    for mine, up in zip(ours, theirs, strict=True):
        for a, b in zip(mine, up, strict=True):
            assert sorted(tokens[a].tolist()) == sorted(tokens[b].tolist())
            if len(set(tokens[b].tolist())) == len(b) and len(a) == 1:
                assert a == b
    used = sorted(i for rank in ours for b in rank for i in b)
    assert used == sorted(i for rank in theirs for b in rank for i in b)
    for rank in bins:
        assert all(int(tokens[b].sum()) <= case["capacity"] for b in rank)
    check_every_record_once(bins, tokens.size, remainder)


def test_ffd_check_and_allocate_by_hand() -> None:
    assert ffd_check(np.array([5, 4, 3, 3]), 8, 2)  # {5,3} {4,3}
    assert not ffd_check(np.array([5, 5, 5]), 8, 2)
    allocations, used = allocate(np.array([5, 4, 3, 3, 6, 6, 7]), 8, 2)
    assert allocations[0] == [[0, 2], [1, 3]]  # the longest prefix that fits two bins
    # [6, 6] fills two bins ([6, 6, 7] would need three), the later 6 first: argsort reversed
    assert allocations[1] == [[5], [4]]
    assert used == 6  # [7] alone opens fewer bins than ranks: the epoch's tail


def test_a_record_over_the_capacity_is_left_out_and_named() -> None:
    tokens = np.array([10, 50, 10, 10, 10, 10])
    bins, remainder = multipack(Pool(np.arange(6), tokens, 2, 1, 1), 20)
    assert remainder["longer_than_max_tokens"].tolist() == [1]
    check_every_record_once(bins, 6, remainder)
