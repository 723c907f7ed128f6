"""Cost models: preset formulas, JSON round-trip, argument checks, and the least-squares fit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bcl_stream.cost import SHAPES, CostModel, fit_cost_model, get_preset, preset_names, resolve


def test_presets_follow_the_training_flops_formula() -> None:
    shape, _ = SHAPES["llama3-8b"]
    model = get_preset("llama3-8b")
    head_dim = 4096 // 32
    attn = 2 * 4096 * 4096 + 2 * 4096 * 8 * head_dim
    mlp = 3 * 4096 * 14336
    assert model.a == 6 * (32 * (attn + mlp) + 4096 * 128256)
    assert model.b == 6 * 32 * 4096
    # About 7.5e9 matmul parameters: 8.03e9 minus the 0.53e9 input embedding table.
    assert 7.4e9 < shape.matmul_params() < 7.6e9


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_round_trips_through_json(name: str, tmp_path) -> None:
    model = get_preset(name)
    path = tmp_path / "m.json"
    model.save(path)
    assert CostModel.load(path) == model
    assert resolve(str(path)) == model
    assert json.loads(path.read_text())["name"] == name


def test_cost_is_monotone_and_quadratic_for_presets() -> None:
    model = get_preset("llama3-70b")
    lengths = np.array([1, 10, 100, 1000, 10000])
    costs = model.cost(lengths)
    assert np.all(np.diff(costs) > 0)
    assert costs[-1] == pytest.approx(model.a * 10000 + model.b * 1e8)


def test_tokens_model_is_identity() -> None:
    assert get_preset("tokens").cost([3, 7]).tolist() == [3.0, 7.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"a": -1.0}, "CostModel.a"),
        ({"a": float("nan")}, "CostModel.a"),
        ({"a": 0.0}, "at least one"),
    ],
)
def test_bad_coefficients_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CostModel(name="x", **kwargs)


def test_unknown_preset_and_unknown_keys_are_named() -> None:
    with pytest.raises(ValueError, match="unknown cost model 'gpt9'"):
        get_preset("gpt9")
    with pytest.raises(ValueError, match="unknown keys"):
        CostModel.from_dict({"name": "x", "a": 1.0, "zeta": 2})


def test_fit_recovers_a_known_model_from_noisy_pack_times() -> None:
    rng = np.random.default_rng(0)
    true = CostModel(name="true", a=2e-4, b=3e-7, k=1e-3, unit="seconds")
    packs = [rng.integers(16, 2048, size=8) for _ in range(200)]
    seconds = np.array([true.cost(p).sum() for p in packs]) * rng.normal(1.0, 0.01, size=200)
    fit = fit_cost_model(packs, seconds)
    assert fit.r2_holdout > 0.99
    assert fit.model.a == pytest.approx(true.a, rel=0.1)
    assert fit.model.b == pytest.approx(true.b, rel=0.1)
    assert fit.model.unit == "seconds"


def test_fit_never_returns_negative_coefficients() -> None:
    rng = np.random.default_rng(1)
    packs = [rng.integers(1, 100, size=4) for _ in range(40)]
    seconds = np.array([10.0 - 0.01 * p.sum() for p in packs])  # decreasing in length
    fit = fit_cost_model(packs, seconds)
    assert min(fit.model.a, fit.model.b, fit.model.k) >= 0


def test_fit_needs_enough_packs() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        fit_cost_model([[1]] * 3, [1.0] * 3)
