"""The ``hf_rebalance`` peer reproduces Transformers' ``BatchRebalanceSampler`` exactly.

Fidelity: ``fixtures/hf_rebalance_upstream.json`` holds fixed inputs and what the real class
yielded on every rank (``tools/hf_fixtures.py``, run once with Transformers 5.23.0: the
version ``hf.py`` follows). The shuffle is torch's, so each case carries the order the
sampler drew and the reproduction is given it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once
from plan_strategies import SEEDS, Grid, grids
from upstream_fixtures import upstream

from bcl_stream.peers import Pool, plan_pooled
from bcl_stream.peers.hf import (
    TRANSFORMERS_VERSION,
    balance_counts,
    hf_rebalance,
    padded_cost,
    rebalance_epoch,
    rebalance_global_batch,
)

UPSTREAM = upstream("hf_rebalance")


def test_fixtures_come_from_the_version_the_module_follows() -> None:
    assert UPSTREAM["transformers_version"] == TRANSFORMERS_VERSION
    # The rare path (a slot frozen when its costliest group is down to one record) is covered.
    assert sum(c["freezes"] > 0 for c in UPSTREAM["cases"]) >= 3
    assert any(not c["drop_last"] and c["n"] % c["effective_batch_size"] for c in UPSTREAM["cases"])


@pytest.mark.parametrize(
    "case",
    UPSTREAM["cases"],
    ids=lambda c: f"{c['kind']}-n{c['n']}-dp{c['dp']}-ga{c['ga']}-drop{int(c['drop_last'])}",
)
def test_groups_match_the_real_sampler_on_every_rank(case: dict[str, Any]) -> None:
    if not case["shuffle"]:
        assert case["order"] == list(range(case["n"]))
    batches = rebalance_epoch(
        case["order"],
        case["lengths"],
        case["effective_batch_size"],
        case["dp"],
        case["ga"],
        drop_last=case["drop_last"],
    )
    per_rank = [[mb for batch in batches for mb in batch[r]] for r in range(case["dp"])]
    assert per_rank == case["ranks"]


@pytest.mark.parametrize(
    "case", [c for c in UPSTREAM["cases"] if c["drop_last"]], ids=lambda c: f"{c['kind']}-n{c['n']}"
)
def test_the_simulator_peer_is_the_sampler_with_drop_last(case: dict[str, Any]) -> None:
    bins, left = hf_rebalance(
        Pool(np.array(case["order"]), np.array(case["lengths"]), case["dp"], case["bs"], case["ga"])
    )
    assert [[b.tolist() for b in rank] for rank in bins] == case["ranks"]
    used = case["n"] // case["effective_batch_size"] * case["effective_batch_size"]
    assert left["epoch_tail"].tolist() == case["order"][used:]


# ----------------------------------------------------------------------------- by hand


def test_padded_cost_is_transformers_formula() -> None:
    assert padded_cost(4, 1000) == 4 * 1000 + 0.001 * 4 * 1000 * 1000
    assert padded_cost(1, 0) == 0.0


def test_long_records_get_small_groups_and_short_ones_large() -> None:
    # One record of 1000 and 15 of 10, two groups: the long one alone costs 2000; the rest,
    # 15 x (10 + 0.1) = 151.5. Upstream moves records off the costly group until it is alone.
    lengths = [1000] + [10] * 15
    assert balance_counts(lengths, 2, 1, 16) == [1, 15]
    ranks = rebalance_global_batch(list(range(16)), lengths, 2, 1)
    assert ranks == [[[0]], [list(range(1, 16))]]


def test_too_few_records_for_the_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot fill 8 groups"):
        balance_counts([5, 4, 3], 4, 2, 8)
    with pytest.raises(ValueError, match="effective_batch_size >= dp_size"):
        rebalance_epoch(range(10), [1] * 10, 4, 4, 2)


# ----------------------------------------------------------------------------- invariants


@settings(max_examples=40, deadline=None)
@given(grid=grids(), extra=st.integers(0, 50), seed=SEEDS)
def test_every_step_holds_the_effective_batch_and_every_record_once(
    grid: Grid, extra: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    r, b, g, steps = grid.ranks, grid.size, grid.group, grid.steps
    n = grid.records + extra % (r * b * g)
    tok = np.minimum(rng.lognormal(5.0, 1.3, n).astype(np.int64) + 1, 8192)
    order = rng.permutation(n)
    bins, left = plan_pooled("hf_rebalance", Pool(order, tok, r, b, g), int(tok.max()))
    check_every_record_once(bins, n, left_out=left["epoch_tail"])
    assert all(len(rank) == g * steps for rank in bins)  # collectives never hang
    assert all(mb.size >= 1 for rank in bins for mb in rank)
    per_step = [
        [sum(rank[k * g + j].size for j in range(g)) for k in range(steps)] for rank in bins
    ]
    # Records per step: exactly r*b*g across the world; a rank's share varies with its groups.
    assert [sum(col) for col in zip(*per_step, strict=True)] == [r * b * g] * steps
