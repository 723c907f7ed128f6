"""The contracts' one registry (``planner/contracts.py``) and the readers' one schedule
interface (``epoch/schedule.py``)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from bcl_stream.commands.config_options import CHOICES
from bcl_stream.epoch.canonical import CanonicalPlan
from bcl_stream.epoch.eval_plan import EvalPlan
from bcl_stream.epoch.plan import ReaderPlan
from bcl_stream.epoch.schedule import Schedule
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.contracts import CONTRACTS, REGISTRY, contract


def test_every_contract_is_one_entry_with_its_module() -> None:
    assert CONTRACTS == ("pack", "step", "tokens")
    for name, promise in REGISTRY.items():
        assert promise.name == name
        importlib.import_module(promise.module)
        for layout in promise.layouts:
            kwargs = {"max_tokens": 4096} if promise.budget else {}
            PlanConfig(world_size=2, contract=name, layout=layout, **kwargs)
    assert [n for n, c in REGISTRY.items() if c.fixed_records] == ["pack"]
    assert [n for n, c in REGISTRY.items() if c.recut_steps] == ["step"]
    assert [n for n, c in REGISTRY.items() if c.budget] == ["tokens"]
    assert [n for n, c in REGISTRY.items() if c.canonical] == ["pack", "tokens"]
    assert all(c.layouts == ("packed", "padded") for c in REGISTRY.values())


def test_the_options_offer_the_registry() -> None:
    assert tuple(CHOICES["contract"]) == CONTRACTS


def test_unknown_and_refused() -> None:
    with pytest.raises(ValueError, match="contract must be one of"):
        contract("bytes")
    with pytest.raises(ValueError, match="contract must be one of"):
        PlanConfig(world_size=2, contract="bytes")
    with pytest.raises(ValueError, match="needs max_tokens"):
        PlanConfig(world_size=2, contract="tokens")


def test_every_plan_a_reader_walks_is_a_schedule() -> None:
    for kind in (ReaderPlan, CanonicalPlan, EvalPlan):
        for name in ("n_packs", "iter_rank_packs", "remainder_counts"):
            assert hasattr(kind, name) or name == "n_packs", (kind, name)
    plan = EvalPlan(np.ones(10), 2, 2, "sequential", "here")
    assert isinstance(plan, Schedule)


def test_plan_epoch_plans_the_token_contract() -> None:
    """plan_epoch under contract='tokens' plans token-budget micro-batches (it used to return
    B-record packs as if the budget did not exist): every micro-batch within max_tokens, the same
    count on every rank, every record once in a micro-batch or in the remainder."""
    from bcl_stream.planner.bcl import plan_epoch
    from bcl_stream.planner.shard_table import ShardTable
    from bcl_stream.planner.token_contract import unpad

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 60, size=256)
    costs = tokens + tokens.astype(float) ** 2 / 100
    config = PlanConfig(
        world_size=2, ranks_per_node=2, pack_size=8, window=2, contract="tokens", max_tokens=128
    )
    plan = plan_epoch(costs, ShardTable.build([128, 128]), config, tokens=tokens)
    held = [unpad(mb) for rank in plan.packs for mb in rank]
    assert all(tokens[mb].sum() <= 128 for mb in held)
    assert len({len(rank) for rank in plan.packs}) == 1
    left = [ids for ids in plan.remainder.values()]
    every = np.concatenate([*held, *left])
    assert sorted(every.tolist()) == list(range(256))
