"""Calibration: pack design invariants, factory loading, and exact recovery of a known cost
function through the whole pipeline (design -> collate -> step -> clock -> fit) with a
deterministic clock, so the test checks the arithmetic, not this machine's noise."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bcl_stream.analysis.calibrate as cal
from bcl_stream.analysis.calibrate import (
    CalibrationConfig,
    calibrate,
    design_packs,
    load_factory,
    make_step,
)
from bcl_stream.cli import main
from bcl_stream.cost import CostModel

TRUE = CostModel(name="truth", a=2e-4, b=3e-8, k=5e-3, unit="seconds")


class FakeClock:
    """Advances only when the fake model 'computes': by TRUE's cost of the batch's records."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_factory(clock: FakeClock):
    def build():
        def step(batch):
            clock.now += float(TRUE.cost(batch["tokens"].numpy()).sum())
            return torch.zeros((), requires_grad=True) * 1.0

        return step

    return build


@pytest.mark.parametrize("pack_size", [1, 4, 8])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_design_packs_invariants(pack_size: int, with_lengths: bool) -> None:
    config = CalibrationConfig(
        pack_size=pack_size, n_packs=24, min_tokens=8, max_tokens=900, pack_tokens=1200
    )
    lengths = np.random.default_rng(1).integers(5, 5000, 300) if with_lengths else None
    packs = design_packs(config, lengths)
    assert len(packs) == 24
    for pack in packs:
        assert pack.shape == (pack_size,)
        assert pack.min() >= 8 and pack.max() <= 900
        assert pack.sum() <= 1200 + pack_size  # rounding may add < 1 token per record
    again = design_packs(config, lengths)
    assert all(np.array_equal(a, b) for a, b in zip(packs, again, strict=True))


def test_design_packs_vary_composition_not_only_size() -> None:
    """Same-total packs with different sum L^2 are what separates a from b."""
    packs = design_packs(CalibrationConfig(pack_size=8, n_packs=30))
    ratio = np.array([(p.astype(float) ** 2).sum() / p.sum() ** 2 for p in packs])
    assert ratio.min() <= 1 / 8 + 1e-9  # equal lengths: sum L^2 / (sum L)^2 = 1/B
    assert ratio.max() > 0.5  # one long record dominates
    totals = np.array([p.sum() for p in packs])
    assert totals.max() > 5 * totals.min()


def test_pipeline_recovers_a_known_cost_function(monkeypatch) -> None:
    clock = FakeClock()
    monkeypatch.setitem(cal.CLOCKS, "cpu", clock)
    config = CalibrationConfig(pack_size=4, n_packs=16, repeats=2, warmup=1, max_tokens=1000)
    result = calibrate(fake_factory(clock), config, presets=("tokens",), progress=False)
    model = result.fit.model
    assert model.unit == "seconds"
    np.testing.assert_allclose([model.a, model.b, model.k], [TRUE.a, TRUE.b, TRUE.k], rtol=1e-6)
    assert result.fit.r2_holdout == pytest.approx(1.0)
    assert result.fit.mean_rel_error_holdout < 1e-6
    assert result.preset_r2["tokens"] < 1.0  # c = L cannot explain the quadratic part
    expected = [float(TRUE.cost(p).sum()) for p in result.packs]
    np.testing.assert_allclose(result.seconds, expected, rtol=1e-9)
    report = result.report()
    assert len(report["packs"]) == 16 and report["timing_rel_iqr_median"] < 1e-9
    json.dumps(report)


def test_real_tinygpt_step_runs_and_backpropagates() -> None:
    from lightning_module.tinygpt import TinyGPT, TinyGPTConfig

    net = TinyGPT(TinyGPTConfig(vocab_size=64, d_model=16, n_heads=2, ffn_hidden=32))
    config = CalibrationConfig(pack_size=2, n_packs=8, repeats=1, warmup=1, max_tokens=64)
    result = calibrate(lambda: net, config, progress=False)
    assert np.all(result.times > 0)
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_load_factory_errors_name_the_problem() -> None:
    assert load_factory("lightning_module.tinygpt:TinyGPT").__name__ == "TinyGPT"
    with pytest.raises(ValueError, match=r"pkg\.module:factory"):
        load_factory("lightning_module.tinygpt")
    with pytest.raises(ValueError, match="cannot import"):
        load_factory("no_such_pkg_xyz.mod:f")
    with pytest.raises(ValueError, match="has no attribute"):
        load_factory("lightning_module.tinygpt:Nope")
    with pytest.raises(ValueError, match="not callable"):
        load_factory("lightning_module.tinygpt:IGNORE_INDEX")


def test_step_refuses_a_loss_without_grad() -> None:
    step = make_step(lambda batch: torch.ones(3))
    with pytest.raises(ValueError, match="scalar loss tensor"):
        step({})
    with pytest.raises(ValueError, match="not a module"):
        make_step(object())


def test_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="pack_tokens"):
        CalibrationConfig(pack_size=8, min_tokens=100, pack_tokens=500)
    with pytest.raises(ValueError, match="clock"):
        CalibrationConfig(clock="tsc")
    with pytest.raises(ValueError, match="max_tokens"):
        CalibrationConfig(min_tokens=10, max_tokens=5)


def test_cli_writes_a_loadable_model(tmp_path, monkeypatch, capsys) -> None:
    clock = FakeClock()
    monkeypatch.setitem(cal.CLOCKS, "cpu", clock)
    module = type(cal)("fake_calib_model")
    module.build = fake_factory(clock)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "fake_calib_model", module)
    out, report = tmp_path / "m.json", tmp_path / "r.json"
    argv = ["calibrate", "--model", "fake_calib_model:build", "--out", str(out)]
    argv += ["--report", str(report), "--packs", "12", "--repeats", "1", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    loaded = CostModel.load(out)
    assert loaded.a == pytest.approx(TRUE.a, rel=1e-6)
    assert summary["r2_holdout"] == pytest.approx(1.0)
    assert len(json.loads(report.read_text())["packs"]) == 12
    assert main([*argv, "--min-r2", "1.5"]) == 1
    assert main(["calibrate", "--model", "nope"]) == 2
