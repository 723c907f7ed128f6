"""The ``trl_token_budget`` peer reproduces TRL's ``TokenBudgetBatcher`` exactly.

Fidelity: ``fixtures/trl_token_budget_upstream.json`` holds fixed samples (lengths in arrival
order) and every micro-batch the upstream batcher yielded for them, row by row
(``tools/trl_fixtures.py``, run once on the upstream class at the revision ``peers/trl.py``
follows). The batcher has no sort and breaks ties by row index, so the check is exact: the
same rows, in the same order, with the same samples in the same order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pack_oracles import check_every_record_once
from upstream_fixtures import upstream

from bcl_stream.peers import PEERS, Pool
from bcl_stream.peers.trl import TRL_REVISION, token_budget_batches, trl_token_budget

UPSTREAM = upstream("trl_token_budget")


def test_fixtures_come_from_the_revision_the_module_follows() -> None:
    assert UPSTREAM["trl_revision"] == TRL_REVISION
    assert PEERS["trl_token_budget"].pooled is False
    assert "central" in PEERS["trl_token_budget"].communication


@pytest.mark.parametrize("case", UPSTREAM["cases"], ids=lambda c: f"{c['kind']}-{c['world_size']}")
def test_every_micro_batch_is_what_the_upstream_batcher_yields(case: dict[str, Any]) -> None:
    lengths = case["lengths"]
    assert (
        token_budget_batches(lengths, case["world_size"], case["token_budget"])
        == case["micro_batches"]
    )


@pytest.mark.parametrize("case", UPSTREAM["cases"], ids=lambda c: f"{c['kind']}-{c['world_size']}")
def test_the_peer_deals_row_r_to_rank_r_and_reports_the_rest(case: dict[str, Any]) -> None:
    tokens = np.array(case["lengths"])
    n, ranks, budget = tokens.size, case["world_size"], case["token_budget"]
    order = np.random.default_rng(7).permutation(n)  # the peer reads the pool's order
    bins, remainder = trl_token_budget(Pool(order, tokens, ranks, 1, 1), budget)
    expected = token_budget_batches(tokens[order].tolist(), ranks, budget)
    assert [[b.tolist() for b in rank] for rank in bins] == [
        [order[mb[r]].tolist() for mb in expected] for r in range(ranks)
    ]
    assert all(b.size > 0 and int(tokens[b].sum()) <= budget for rank in bins for b in rank)
    assert remainder.get("longer_than_max_tokens", np.empty(0)).size == int((tokens > budget).sum())
    check_every_record_once(bins, n, remainder)


def test_by_hand_least_squared_load_with_room_then_close() -> None:
    # budget 8, 2 rows: 5 -> row 0; 3 -> row 1 (0 < 25); 2 -> row 1 (9 < 25); 4 fits no row
    # (5+4, 5+4 > 8): emit, reopen with 4 in row 0; 9 > 8 is dropped; 1 -> row 1 (0 < 16).
    assert token_budget_batches([5, 3, 2, 4, 9, 1], 2, 8) == [[[0], [1, 2]]]
    bins, remainder = trl_token_budget(Pool(np.arange(6), np.array([5, 3, 2, 4, 9, 1]), 2, 1, 1), 8)
    assert [[b.tolist() for b in rank] for rank in bins] == [[[0]], [[1, 2]]]
    assert remainder["epoch_tail"].tolist() == [3, 5]  # the last open micro-batch
    assert remainder["longer_than_max_tokens"].tolist() == [4]
