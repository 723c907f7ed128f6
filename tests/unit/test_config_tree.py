"""One config tree: PlanConfig's fields, and only its defaults, reach every entry point.

Every PlanConfig field must be settable through ``ReaderConfig``, ``SimConfig``, the ``plan``
and ``simulate`` command lines and ``BCLDataModule``; a reader config survives the cursor's
JSON nested; the old flat layout is refused with what to do.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from bcl_stream import ProcessLayout
from bcl_stream.analysis.sim import SimConfig, plan_config
from bcl_stream.cli import build_parser
from bcl_stream.commands.plan import config_from_args
from bcl_stream.commands.simulate import sim_config
from bcl_stream.epoch.cursor import Cursor, parse_state
from bcl_stream.epoch.plan import PLAN_FIELDS, ReaderConfig
from bcl_stream.errors import StateError
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.config import LAYOUT_FIELDS
from bcl_stream.planner.partition import ALGORITHMS
from bcl_stream.training import TrainingContext, reader_config
from lightning_module.datamodule import BCLDataModule

BASE = {"world_size": 4, "pack_size": 3, "window": 5}
"""The required fields, at values other than any default."""
OTHER_ALGORITHM = sorted(set(ALGORITHMS) - {"lpt"})[0]
VALUES: dict[str, Any] = {
    "world_size": 6,
    "pack_size": 2,
    "window": 7,
    "ranks_per_node": 2,
    "scope": "world",
    "max_tokens": 900,
    "algorithm": OTHER_ALGORITHM,
    "refine": 3,
    "pack_order": "stream",
    "step_fill": False,
    "carry": 4,
    "carry_span": 9,
    "grad_accum": 3,
    "shuffle": False,
    "stratify": False,
    "split_shards": 0.25,
    "max_amplification": 3.0,
    "lane": 4,
    "lane_threshold": 2.5,
    "shard_group": 5,
    "world_row": 3,
    "layout": "padded",
    "contract": "step",
    "two_term_slack": 0.001,
}
"""A valid value for each PlanConfig field, different from its default and from BASE."""


def test_values_cover_every_field_and_differ_from_the_defaults() -> None:
    """A new PlanConfig field fails here until the tests below cover it."""
    assert set(VALUES) == PLAN_FIELDS
    for f in fields(PlanConfig):
        assert VALUES[f.name] != f.default, f.name
        assert VALUES[f.name] != BASE.get(f.name), f.name


def cli_args(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, str(value)]


@pytest.mark.parametrize("name", sorted(PLAN_FIELDS))
def test_every_field_through_the_plan_command(name: str) -> None:
    base = {k: v for k, v in BASE.items() if k != name}
    argv = ["plan", "DIR"] + [a for k, v in base.items() for a in cli_args(k, v)]
    args = build_parser().parse_args(argv + cli_args(name, VALUES[name]))
    config = config_from_args(args)
    assert getattr(config.plan, name) == VALUES[name]
    # Everything not given keeps PlanConfig's default (no second default in the CLI), but the
    # layout's rule: --world-size R alone is one node of R ranks (commands/layout_options.py).
    given = {**base, name: VALUES[name]}
    given.setdefault("ranks_per_node", given["world_size"])
    assert config.plan == PlanConfig(**given)


@pytest.mark.parametrize("name", sorted(PLAN_FIELDS - {"scope"}))
def test_every_field_through_the_simulate_command(name: str) -> None:
    """``scope`` is the strategy's (``bcl-rank``/``bcl-node``/``bcl-world``), not an option."""
    args = build_parser().parse_args(
        ["simulate", "--lengths", "x.npy", *cli_args(name, VALUES[name])]
    )
    planned = plan_config(sim_config(args), "node")
    assert getattr(planned, name) == VALUES[name]


def test_simulate_has_no_scope_option_and_keeps_plan_defaults() -> None:
    """One set of defaults (issue 26, point 4): simulate's only defaults of its own are the
    job's shape (8 ranks, B=8, W=16), which plan and read require, and ranks per node by the
    layout's rule (one node of 8, as in plan and read); gradient accumulation and every other
    planner field are PlanConfig's, as in plan and read."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--lengths", "x.npy", "--scope", "node"])
    config = sim_config(build_parser().parse_args(["simulate", "--lengths", "x.npy"]))
    assert (config.ranks, config.ranks_per_node, config.pack_size, config.window) == (8, 8, 8, 16)
    planned = plan_config(config, "rank")
    scenario = {"world_size", "ranks_per_node", "pack_size", "window", "scope"}
    for f in fields(PlanConfig):
        if f.name not in scenario:
            assert getattr(planned, f.name) == f.default, f.name


@pytest.mark.parametrize("name", sorted(PLAN_FIELDS))
def test_every_field_through_the_datamodule(name: str) -> None:
    """Every knob through ``plan``; the layout from the trainer, never a knob; the plan's
    cost layout from the batch's (``batch.collate``)."""
    value = VALUES[name]
    layout = {"world_size": BASE["world_size"], "ranks_per_node": 1, "grad_accum": 1}
    knobs = {"pack_size": BASE["pack_size"], "window": BASE["window"]}
    batch = {}
    if name in LAYOUT_FIELDS:
        layout[name] = value
    elif name == "layout":
        batch["collate"] = value
    else:
        knobs[name] = value
    module = BCLDataModule("DIR", plan=knobs, batch=batch)
    accum = layout.pop("grad_accum")
    context = TrainingContext(process=ProcessLayout(**layout), grad_accum=accum)
    config = reader_config(module.knobs, context)
    assert getattr(config.plan, name) == value


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        ({"bogus": 1}, r"unknown keys \['bogus'\]"),
        ({"world_size": 4}, r"plan.world_size: the trainer's data-parallel size decides it"),
        ({"carry_span": -1}, "carry_span"),
    ],
)
def test_datamodule_plan_is_checked_when_built(plan: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BCLDataModule("DIR", plan=plan)


def test_datamodule_views_its_knobs_read_only() -> None:
    """``plan``, ``batch``, ``packing``... are the knobs' own values, and cannot be set apart
    from them (the knobs are the one place a choice is held)."""
    module = BCLDataModule(
        "DIR", plan={"pack_size": 3}, batch={"collate": "packed"}, seed=5, packing="sequential"
    )
    views = ["plan", "batch", "tokens", "packing", "cost_model", "seed"]
    assert all(getattr(module, v) is getattr(module.knobs, v) for v in views)
    assert (module.plan.pack_size, module.layout, module.seed) == (3, "packed", 5)
    for view in views:
        with pytest.raises(AttributeError, match=f"{view} is read-only"):
            setattr(module, view, None)
    assert module.packing == "sequential"


def test_reader_config_build_and_nested_fields() -> None:
    config = ReaderConfig.build(seed=3, cost_model="tokens", **VALUES)
    assert config.plan == PlanConfig(**VALUES)
    resized = config.resized(ProcessLayout(world_size=8, ranks_per_node=4))
    assert (resized.plan.world_size, resized.plan.ranks_per_node) == (8, 4)
    assert resized.plan.carry_span == VALUES["carry_span"] and resized.seed == 3
    with pytest.raises(ValueError, match=r"unknown reader config fields \['bogus'\]"):
        ReaderConfig.build(bogus=1, **BASE)


def test_nested_config_round_trips_through_the_cursor_json() -> None:
    config = ReaderConfig.build(seed=3, cost_model="tokens", **VALUES)
    saved = json.loads(json.dumps(Cursor(1, 2, "f" * 16, config).to_dict()))
    assert set(saved["config"]) == {"plan", "seed", "cost_model", "packing"}
    assert saved["config"]["plan"] == {name: VALUES[name] for name in PLAN_FIELDS}
    assert parse_state(saved).config == config


def test_old_flat_layout_in_a_version_2_cursor_is_refused() -> None:
    config = ReaderConfig.build(**BASE)
    saved = Cursor(0, 1, "f" * 16, config).to_dict()
    saved["config"] = config.flat()  # what the release before the nested layout wrote
    with pytest.raises(StateError, match=r"old flat layout.*nests them under 'plan'"):
        parse_state(json.loads(json.dumps(saved)))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c.update(extra=1), r"unknown keys \['extra'\]"),
        (lambda c: c["plan"].update(extra=1), r"'plan' has unknown keys \['extra'\]"),
        (lambda c: c.update(plan=[1]), "'plan' must be a dict"),
        (lambda c: c.pop("plan"), "'plan' must be a dict"),
        (lambda c: c["plan"].update(stratify=1), "stratify must be True or False"),
        (lambda c: c["plan"].update(carry_span=True), "'carry_span' is a bool"),
    ],
)
def test_malformed_nested_config_is_named(change: Any, match: str) -> None:
    saved = json.loads(json.dumps(Cursor(0, 1, "f" * 16, ReaderConfig.build(**BASE)).to_dict()))
    change(saved["config"])
    with pytest.raises(StateError, match=match):
        parse_state(saved)


def test_sim_config_holds_every_plan_field_but_world_size_and_scope() -> None:
    sim = {f.name: f.default for f in fields(SimConfig)}
    for f in fields(PlanConfig):
        if f.name in ("world_size", "scope"):
            continue
        assert f.name in sim, f.name
        if f.name not in ("ranks_per_node", "pack_size", "window", "grad_accum"):
            assert sim[f.name] == f.default, f"SimConfig.{f.name} repeats a different default"


def test_datamodule_plan_from_yaml_as_lightning_cli_reads_it() -> None:
    """``data.init_args.plan`` in a LightningCLI YAML: jsonargparse reads the signature."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(BCLDataModule, "data")
    text = "data:\n  data: DIR\n  plan: {window: 4, carry_span: 32, stratify: false}\n"
    module = BCLDataModule(**parser.parse_string(text).data.as_dict())
    plan = reader_config(module.knobs, TrainingContext(process=ProcessLayout(world_size=2))).plan
    assert (plan.window, plan.carry_span, plan.stratify) == (4, 32, False)


def test_sim_config_inherits_the_knobs_and_refuses_a_scope_of_its_own() -> None:
    """SimConfig's knobs are PlanKnobs' fields (one declaration); its strategies set the scope."""
    from bcl_stream.planner.config import PlanKnobs

    knobs = {f.name: f.default for f in fields(PlanKnobs)}
    assert issubclass(SimConfig, PlanKnobs)
    assert {f.name: f.default for f in fields(SimConfig) if f.name in knobs} == knobs
    assert set(SimConfig.__slots__) >= set(knobs)  # inherited fields listed as its own
    with pytest.raises(ValueError, match=r"SimConfig.scope='world': the simulator sets the scope"):
        SimConfig(scope="world")
