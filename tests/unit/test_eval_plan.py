"""The evaluation plan (``epoch/eval_plan.py``): every record once across ranks, the same
number of packs on every rank, at most B records per pack; refused when impossible."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once

from bcl_stream.epoch.eval_plan import EvalPlan
from bcl_stream.errors import PlanError


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    world=st.integers(1, 9),
    pack=st.integers(2, 12),
    packing=st.sampled_from(["sequential", "bcl"]),
    seed=st.integers(0, 3),
)
def test_every_record_once_equal_pack_counts(
    n: int, world: int, pack: int, packing: str, seed: int
) -> None:
    costs = np.random.default_rng(seed).lognormal(size=n)
    if n < world:
        with pytest.raises(PlanError, match="cannot give each of"):
            EvalPlan(costs, world, pack, packing)
        return
    plan = EvalPlan(costs, world, pack, packing)
    ids = []
    for rank in range(world):
        packs = plan.rank_packs(rank)
        assert len(packs) == plan.n_packs  # the same step count on every rank
        assert all(1 <= len(p) <= pack for p in packs)
        batches = list(plan.iter_rank_packs(rank))
        assert sum(b.shape[0] for _, b in batches) == plan.n_packs
        assert [p.tolist() for _, b in batches for p in b] == [p.tolist() for p in packs]
        ids += [int(i) for p in packs for i in p]
    check_every_record_once(ids, n)
    assert plan.remainder_counts() == {}


def test_balanced_packing_puts_similar_costs_in_one_step() -> None:
    costs = np.random.default_rng(0).lognormal(size=512)
    seq, bcl = (EvalPlan(costs, 4, 8, p) for p in ("sequential", "bcl"))

    def efficiency(plan: EvalPlan) -> float:
        steps = np.array([[costs[p].sum() for p in plan.rank_packs(r)] for r in range(4)])
        return float(steps.mean(axis=0).sum() / steps.max(axis=0).sum())

    assert efficiency(bcl) > 0.95 and efficiency(seq) < 0.8  # measured: 0.974, 0.697


def test_pack_size_one_with_uneven_shares_is_refused() -> None:
    with pytest.raises(PlanError, match="pack_size >= 2"):
        EvalPlan(np.ones(5), 2, 1)
    assert EvalPlan(np.ones(6), 2, 1).n_packs == 3
