"""PlanKnobs.build: the knobs and the trainer's layout make the planner config in one call, the
same config the flat spelling makes, and a knob that does not exist is refused by name."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bcl_stream import PlanConfig
from bcl_stream.analysis.sim import SimConfig, plan_config
from bcl_stream.planner.config import PlanKnobs


def test_build_is_the_flat_config() -> None:
    knobs = PlanKnobs(pack_size=4, window=8, scope="world", carry=None, layout="padded")
    built = knobs.build(world_size=16, ranks_per_node=8, grad_accum=2, layout="packed")
    flat = {**asdict(knobs), "layout": "packed"}
    assert built == PlanConfig(**flat, world_size=16, ranks_per_node=8, grad_accum=2)
    assert knobs.layout == "padded"  # the knobs themselves are not changed


def test_an_unknown_knob_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown planner knobs \['windw'\]"):
        PlanKnobs().build(world_size=2, windw=3)
    with pytest.raises(ValueError, match=r"unknown planner knobs \['canonical_ranks'\]"):
        PlanKnobs().build(world_size=2, canonical_ranks=4)  # a reader's field, not a knob


def test_a_simulated_strategy_plans_with_its_knobs_and_layout() -> None:
    sim = SimConfig(ranks=8, ranks_per_node=4, grad_accum=2, window=4, refine=0)
    planner = plan_config(sim, "node")
    assert (planner.world_size, planner.ranks_per_node, planner.grad_accum) == (8, 4, 2)
    assert (planner.scope, planner.window, planner.refine) == ("node", 4, 0)
    canonical = plan_config(SimConfig(ranks=4, ranks_per_node=2, canonical_ranks=8), "rank")
    assert (canonical.world_size, canonical.ranks_per_node, canonical.grad_accum) == (8, 2, 2)
