"""The simulator's layout: pack costs follow the layout from the schedules' own packs, padding
waste is accounted, BCL plans padded packs by length, and ``simulate --layout padded`` reports
both layouts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from shard_tables import lognormal_lengths

from bcl_stream.analysis.sim import STRATEGIES, SimConfig, plan_config, schedules, simulate
from bcl_stream.cli import main
from bcl_stream.cost import get_preset
from bcl_stream.planner.padded import pack_cost


def _lengths(n: int = 4096, seed: int = 0) -> np.ndarray:
    return lognormal_lengths(n, seed, sigma=1.1)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_schedules_expose_packs_whose_costs_are_the_matrix(layout: str) -> None:
    tok = _lengths()
    model = get_preset("llama3-8b")
    costs = model.cost(tok)
    config = SimConfig(window=4, ranks_per_node=4, layout=layout)
    for name, s in schedules(tok, model, config).items():
        assert len(s.packs) == config.ranks, name
        ids = np.concatenate([np.asarray(p) for rank in s.packs for p in rank])
        assert ids.size == s.records_used and np.unique(ids).size == ids.size, name
        for r, rank in enumerate(s.packs):
            for t, pack in enumerate(rank):
                assert s.pack_costs[r, t] == pytest.approx(pack_cost(costs[pack], layout)), name
                assert s.useful_costs[r, t] == pytest.approx(costs[pack].sum()), name
        if layout == "packed":
            assert np.array_equal(s.pack_costs, s.useful_costs), name


def test_padded_waste_is_reported_and_bcl_wastes_less_than_sequential() -> None:
    tok = _lengths()
    model = get_preset("llama3-8b")
    padded = simulate(tok, model, SimConfig(window=8, layout="padded"))
    packed = simulate(tok, model, SimConfig(window=8))
    assert all(m.padding_waste == 0.0 for m in packed.values())
    assert all(0.0 < m.padding_waste < 1.0 for m in padded.values())
    seq = padded["sequential"]
    for scope in ("bcl-rank", "bcl-node", "bcl-world"):
        assert padded[scope].padding_waste < seq.padding_waste, scope
        assert padded[scope].time < seq.time / 2, scope
    # A window of the whole world sorts 8x more records than one rank's: far less padding.
    assert padded["bcl-world"].padding_waste < seq.padding_waste / 4
    # Same records, same units: padding costs sequential more than packing would.
    assert padded["sequential"].time > packed["sequential"].time


def test_padded_bcl_plans_similar_lengths_together() -> None:
    """Planning for the padded layout beats a plan balanced for sums, scored as padded."""
    tok = _lengths()
    model = get_preset("llama3-8b")
    config = SimConfig(window=8)
    for scope in ("bcl-rank", "bcl-world"):
        by_sum = schedules(tok, model, config, (scope,))[scope]
        by_max = schedules(tok, model, dataclasses.replace(config, layout="padded"), (scope,))[
            scope
        ]
        resc = np.array(
            [[pack_cost(model.cost(tok[p]), "padded") for p in r] for r in by_sum.packs]
        )
        assert by_max.pack_costs.max(axis=0).sum() < resc.max(axis=0).sum(), scope


def test_plan_config_selects_the_padded_partition_only_for_padded() -> None:
    padded = plan_config(SimConfig(layout="padded"), "world")
    assert (padded.layout, padded.partition_algorithm) == ("padded", "padded")
    assert plan_config(SimConfig(), "world").partition_algorithm == "lpt"
    # the unbalanced baseline keeps stream order whatever the layout
    assert padded.unbalanced().partition_algorithm == "stream"
    with pytest.raises(ValueError, match="layout must be one of"):
        schedules(_lengths(100), get_preset("tokens"), SimConfig(layout="ragged"))


def test_cli_padded_json_reports_both_layouts(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--lengths", str(lengths_file), "--window", "4", "--layout", "padded"]
    assert main([*args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["config"]["layout"] == "padded"
    assert set(payload["layouts"]) == {"packed", "padded"}
    assert payload["strategies"] == payload["layouts"]["padded"]
    for layout, scored in payload["layouts"].items():
        assert set(scored) == set(STRATEGIES)
        wastes = [m["padding_waste"] for m in scored.values()]
        assert all(w == 0.0 for w in wastes) if layout == "packed" else all(w > 0 for w in wastes)
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()  # the set-up line, then the tables
    assert [line for line in out if line.startswith("layout")] == ["layout packed", "layout padded"]
    assert out[2].split()[-2:] == ["waste", "vs_packed_seq"]
