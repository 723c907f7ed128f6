"""The statistics of ``tools/bench_measured.py`` on planted timings: known answers, and planted
faults (a straggling rank, timings attached to the wrong packs, a per-micro-batch price) that the
intervals, the held-out R^2 and the overhead fit must catch."""

from __future__ import annotations

import numpy as np
import pytest

from bcl_bench.measured_plans import probe_packs
from bcl_bench.measured_stats import (
    as_matrix,
    bootstrap_steps,
    efficiency,
    fit_overhead,
    holdout_r2,
    per_round,
    speedup,
)


def balanced(rng: np.random.Generator, ranks: int = 8, steps: int = 48) -> np.ndarray:
    """Every rank's pack costs 1 +- 5%."""
    return rng.uniform(0.95, 1.05, size=(ranks, steps))


def straggling(rng: np.random.Generator, ranks: int = 8, steps: int = 48) -> np.ndarray:
    """As balanced, but one rank per step is 40% slower: efficiency ~ 1.05 / 1.4."""
    m = balanced(rng, ranks, steps)
    m[rng.integers(0, ranks, steps), np.arange(steps)] *= 1.4
    return m


def test_efficiency_known_answer_and_degenerate_interval() -> None:
    # every step: 3 ranks at 1 s, one at 2 s -> mean 1.25, max 2 -> 0.625, whatever is resampled
    m = np.tile(np.array([[1.0], [1.0], [1.0], [2.0]]), (1, 10))
    assert efficiency(m) == pytest.approx(0.625)
    boot = bootstrap_steps({"a": m}, n_boot=200)
    assert boot.efficiency["a"] == pytest.approx((0.625, 0.625))
    assert as_matrix([[1.0, 2.0], [3.0]]).tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_planted_straggler_is_resolved_and_its_speedup_interval_holds_the_truth() -> None:
    rng = np.random.default_rng(1)
    fast, slow = balanced(rng), straggling(rng)
    boot = bootstrap_steps({"fast": fast, "slow": slow}, n_boot=2000, seed=3)
    low, high = boot.speedup[("fast", "slow")]
    assert low <= speedup(fast, slow) <= high
    assert low > 1.2  # the planted 1.4x straggler (max of 8 uniforms ~ 1.04) is not noise
    assert high < 1.45
    # the reverse pair is the reciprocal interval
    assert boot.speedup[("slow", "fast")] == pytest.approx((1 / high, 1 / low))
    # the two efficiencies' intervals do not overlap
    assert boot.efficiency["slow"][1] < boot.efficiency["fast"][0]


def test_paired_resampling_gives_an_identical_plan_a_speedup_of_exactly_one() -> None:
    # independent draws would give the pair a spread; paired draws (same steps) give none
    m = straggling(np.random.default_rng(2))
    boot = bootstrap_steps({"a": m, "copy": m.copy()}, n_boot=500)
    assert boot.speedup[("a", "copy")] == pytest.approx((1.0, 1.0))


def test_interval_covers_the_true_efficiency_at_about_its_level() -> None:
    # 4 ranks of i.i.d. uniform(0, 1) pack times: E[mean] = 1/2, E[max] = 4/5, so the efficiency
    # of a long epoch tends to 0.625; a 95% interval from 32 steps must cover it ~95% of the time
    rng = np.random.default_rng(4)
    covered = 0
    trials = 300
    for trial in range(trials):
        m = rng.uniform(0, 1, size=(4, 32))
        low, high = bootstrap_steps({"x": m}, n_boot=400, seed=trial).efficiency["x"]
        covered += low <= 0.625 <= high
    # the percentile bootstrap under-covers a little at 32 steps (0.92 with these draws); an
    # interval at the wrong level (a 90% one: 0.88) or resampling the wrong axis falls outside
    assert 0.90 <= covered / trials <= 0.98


def test_per_round_scores_each_round_alone() -> None:
    m = np.ones((3, 4, 6))  # 3 rounds, 4 ranks, 6 steps, all balanced
    m[1, 2, :] = 2.0  # round 1: rank 2 twice as slow in every step
    rounds = per_round({"a": m, "b": np.ones((3, 4, 6))})
    assert rounds["efficiency"]["a"] == pytest.approx([1.0, 5 / 8, 1.0])
    assert rounds["speedup"]["b/a"] == pytest.approx([1.0, 2.0, 1.0])
    assert rounds["spread"] == pytest.approx(3 / 8)


def planted_packs(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    counts = rng.integers(1, 33, n)
    return [rng.integers(16, 1024, c) for c in counts]


def pack_seconds(packs: list[np.ndarray], c: float) -> np.ndarray:
    """a = 50 us/token, b = 3e-8 s/token^2, k = 0.2 ms per record, c per micro-batch."""
    return np.array(
        [5e-5 * p.sum() + 3e-8 * np.sum(p.astype(float) ** 2) + 2e-4 * p.size + c for p in packs]
    )


def test_holdout_r2_known_answer_and_a_planted_mismatch() -> None:
    rng = np.random.default_rng(5)
    packs = planted_packs(rng, 60)
    y = pack_seconds(packs, 0.0)
    train = np.arange(60) % 2 == 0
    held = holdout_r2(packs, y, train)
    assert held.r2_holdout == pytest.approx(1.0)
    assert held.coef == pytest.approx((5e-5, 3e-8, 2e-4), rel=1e-6)
    # the same timings attached to the wrong packs (a bookkeeping bug in the tool): caught
    wrong = holdout_r2(packs, rng.permutation(y), train)
    assert wrong.r2_holdout < 0.5
    with pytest.raises(ValueError, match="held-out"):
        holdout_r2(packs[:4], y[:4], [True, True, True, True])


def test_overhead_fit_recovers_a_planted_price_per_micro_batch() -> None:
    # planned packs alone (hundreds of ms, +-3% noise) hide a 3 ms constant; the tool's probe
    # packs (64-1024 tokens in 1-32 records) bring it out
    rng = np.random.default_rng(6)
    packs = planted_packs(rng, 120) + probe_packs(1024) * 2
    noisy = pack_seconds(packs, 3e-3) * rng.uniform(0.97, 1.03, len(packs))
    fit = fit_overhead(packs, noisy, n_boot=300)
    low, high = fit.per_micro_batch_ci
    assert low <= 3e-3 <= high
    assert low > 1e-3  # resolved from zero
    assert fit.per_record_s == pytest.approx(2e-4, rel=0.3)
    assert fit.record_counts[0] < fit.record_counts[1]


def test_overhead_fit_invents_no_price_where_none_was_planted() -> None:
    rng = np.random.default_rng(7)
    packs = planted_packs(rng, 120) + probe_packs(1024) * 2
    noisy = pack_seconds(packs, 0.0) * rng.uniform(0.97, 1.03, len(packs))
    fit = fit_overhead(packs, noisy, n_boot=300)
    assert fit.per_micro_batch_ci[0] == 0.0
    assert fit.per_micro_batch_s < 1e-3


def test_overhead_fit_refuses_packs_of_one_record_count() -> None:
    rng = np.random.default_rng(8)
    packs = [rng.integers(16, 1024, 8) for _ in range(20)]
    with pytest.raises(ValueError, match="different record counts"):
        fit_overhead(packs, pack_seconds(packs, 1e-3))


def test_bootstrap_refuses_a_plan_with_an_empty_step() -> None:
    m = np.ones((4, 5))
    m[:, 2] = 0.0
    with pytest.raises(ValueError, match="work in every step"):
        bootstrap_steps({"gap": m})
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_steps({"a": np.ones((2, 3))}, n_boot=10)


def test_every_strategy_and_contract_plans_the_same_records_once() -> None:
    from bcl_bench.corpora import stdlib_lengths
    from bcl_bench.measured_plans import Setting, measured_order, plan_contracts, plan_strategies
    from bcl_stream.cost import get_preset

    tokens = np.minimum(stdlib_lengths("cl100k"), 1024)
    setting = Setting(ranks=4, pack_size=4, window=4, steps=8, grad_accum=4, seed=0)
    want = sorted(measured_order(tokens.size, setting).tolist())
    plans, _ = plan_strategies(tokens, {"calibrated": get_preset("tokens")}, setting)
    assert {"sequential", "nemo_mffd", "verl_kk", "bcl-world"} <= set(plans)
    for name, packs in plans.items():
        assert sorted(np.concatenate([p for r in packs for p in r]).tolist()) == want, name
    contracts = plan_contracts(tokens, get_preset("tokens"), setting, ("pack", "step", "tokens"))
    pack, step = contracts["pack"], contracts["step"]
    for entry in (pack, step):
        mbs = entry["micro_batches"]
        assert sorted(np.concatenate([p for r in mbs for p in r]).tolist()) == want
        assert entry["peak_tokens"] <= pack["peak_tokens"]  # the same memory budget
    assert step["max_tokens"] == pack["peak_tokens"]
    assert contracts["tokens"]["status"] == "planned"


def test_the_token_contract_is_measured_under_the_pack_peak_with_every_record_once() -> None:
    from bcl_bench.measured_plans import Setting, measured_order, plan_contracts
    from bcl_stream.cost import get_preset

    # planted lengths: mostly short records and a heavy tail, so micro-batches vary in records
    rng = np.random.default_rng(5)
    tokens = np.where(
        rng.random(4000) < 0.1, rng.integers(400, 1000, 4000), rng.integers(8, 120, 4000)
    )
    setting = Setting(ranks=4, pack_size=4, window=4, steps=12, grad_accum=4, seed=0)
    want = sorted(measured_order(tokens.size, setting).tolist())
    out = plan_contracts(tokens, get_preset("tokens"), setting, ("tokens",))
    pack, tok = out["pack"], out["tokens"]
    assert tok["status"] == "planned"
    cap = pack["peak_tokens"]
    assert tok["max_tokens"] == cap
    mbs = tok["micro_batches"]
    assert all(-1 not in mb for rank in mbs for mb in rank)  # the plan's padding is stripped
    assert max(int(tokens[mb].sum()) for rank in mbs for mb in rank) == tok["peak_tokens"] <= cap
    counts = {len(rank) for rank in mbs}
    assert len(counts) == 1 and counts.pop() % setting.grad_accum == 0  # equal, whole steps
    held = [i for rank in mbs for mb in rank for i in mb.tolist()]
    reported = [i for ids in tok["remainder_ids"].values() for i in ids.tolist()]
    assert sorted(held + reported) == want  # every measured record once: held or reported
    assert tok["records"] == len(held)
    assert sum(tok["remainder"].values()) == len(reported)
    assert len({len(mb) for rank in mbs for mb in rank}) > 1  # records per micro-batch vary


def test_a_contract_without_a_micro_batch_reader_is_reported_not_faked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bcl_bench import measured_plans
    from bcl_bench.corpora import stdlib_lengths
    from bcl_stream.cost import get_preset

    monkeypatch.delitem(measured_plans.MICRO_BATCHES, "step")
    tokens = np.minimum(stdlib_lengths("cl100k"), 1024)
    setting = measured_plans.Setting(ranks=2, pack_size=2, window=2, steps=4, grad_accum=2, seed=0)
    out = measured_plans.plan_contracts(tokens, get_preset("tokens"), setting, ("step",))
    assert out["pack"]["status"] == "planned"
    assert out["step"]["status"] == "not yet available"
    assert "MICRO_BATCHES" in out["step"]["why"]
