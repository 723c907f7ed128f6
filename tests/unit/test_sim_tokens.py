"""The simulator under ``contract="tokens"`` and the per-micro-batch price
(``analysis/sim.py``: ``--micro-batch-overhead``, ``budget_figures``, ``pool_records``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.analysis.sim import (
    SimConfig,
    budget_figures,
    micro_batch_price,
    plan_schedules,
    pool_records,
    score,
    shard_table,
)
from bcl_stream.cli import main
from bcl_stream.cost import resolve
from bcl_stream.planner.token_contract import FILL

T = 4096


def _lengths(n: int = 12_000) -> np.ndarray:
    rng = np.random.default_rng(5)
    return np.minimum((rng.pareto(1.3, n) * 60 + 8).astype(np.int64), 3000)


def test_bcl_under_the_budget_with_equal_counts_and_the_figures() -> None:
    tok = _lengths()
    costs = resolve("llama3-8b").cost(tok)
    config = SimConfig(contract="tokens", max_tokens=T, shard_records=500)
    table = shard_table(tok, costs, config.shard_records)
    names = ("bcl-node", "bcl-rank", "verl_dynbsz", "nemo_mffd")
    planned = plan_schedules(tok, costs, table, config, names)
    for name in ("bcl-node", "bcl-rank"):
        s = planned[name]
        counts = {len(rank) for rank in s.packs}
        assert len(counts) == 1 and counts.pop() % config.grad_accum == 0
        held = [int(tok[ids].sum()) for rank in s.packs for ids in rank]
        assert max(held) <= T and min(len(ids) for rank in s.packs for ids in rank) >= 1
        ids = np.concatenate([ids for rank in s.packs for ids in rank])
        assert np.unique(ids).size == ids.size == s.records_used
        assert s.records_used + s.records_left == tok.size
        figures = budget_figures(s, tok)
        assert figures["micro_batch_tokens"] == {"max": max(held), "mean": np.mean(held)}
        assert figures["micro_batches_per_rank"]["min"] == figures["micro_batches_per_rank"]["max"]
        assert figures["useful_cost"] == pytest.approx(float(costs[ids].sum()))
    # NeMo-RL's bins hold at most the capacity; verl's dynamic micro-batches are a workload
    # partition into ceil(tokens / budget) parts, which may pass the budget (as verl runs it)
    held = [int(tok[ids].sum()) for rank in planned["nemo_mffd"].packs for ids in rank]
    assert max(held) <= T


def test_the_price_is_a_share_of_a_full_budget_micro_batch_and_counts_in_time() -> None:
    tok = np.array([10, 20, 30, 40], dtype=np.int64)  # mean 25: c(25) between c(20) and c(30)
    model = resolve("llama3-8b")
    costs = model.cost(tok)
    config = SimConfig(max_tokens=100, micro_batch_overhead=0.5)
    at_mean = float(np.interp(25, tok, costs))
    assert micro_batch_price(tok, costs, config) == pytest.approx(0.5 * 100 / 25 * at_mean)
    assert micro_batch_price(tok, costs, SimConfig(max_tokens=100)) == 0.0
    big = _lengths(4000)
    big_costs = model.cost(big)
    sim = SimConfig(contract="tokens", max_tokens=T, shard_records=500)
    table = shard_table(big, big_costs, 500)
    planned = plan_schedules(big, big_costs, table, sim, ("bcl-node",))
    price = 123.0
    plain = score(planned, sim)["bcl-node"]
    priced = score(planned, sim, price=price)["bcl-node"]
    assert priced.time == pytest.approx(plain.time + price * plain.packs_per_rank)


def test_pool_records_match_a_bcl_step_under_the_tokens_contract() -> None:
    tok = np.full(1000, 100, dtype=np.int64)
    assert pool_records(tok, SimConfig(max_tokens=T)) == 8  # the record contract's B
    assert pool_records(tok, SimConfig(contract="tokens", max_tokens=T)) == round(T * FILL / 100)


def test_refused_settings() -> None:
    with pytest.raises(ValueError, match="micro_batch_overhead"):
        SimConfig(micro_batch_overhead=-1.0)
    SimConfig(
        contract="tokens", max_tokens=T, canonical_ranks=16
    )  # planned (test_canonical_tokens)
    with pytest.raises(ValueError, match="canonical_ranks=12 needs ranks dividing it"):
        SimConfig(contract="tokens", max_tokens=T, canonical_ranks=12)


def test_cli_json_reports_the_budget_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, _lengths(6000))
    argv = ["simulate", "--lengths", str(path), "--ranks", "4", "--contract", "tokens"]
    argv += ["--max-tokens", str(T), "--micro-batch-overhead", "0.1", "--json"]
    argv += ["--strategies", "bcl-node,verl_dynbsz", "--shard-records", "500"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["micro_batch_overhead"] == 0.1
    for name in ("bcl-node", "verl_dynbsz"):
        row = out["strategies"][name]
        assert row["micro_batch_tokens"]["max"] > 0
        assert set(row["micro_batches_per_rank"]) == {"min", "max"}
        assert row["useful_cost"] > 0 and row["time"] > 0
    assert out["strategies"]["bcl-node"]["micro_batch_tokens"]["max"] <= T
    node = out["strategies"]["bcl-node"]["micro_batches_per_rank"]
    assert node["min"] == node["max"]


def test_the_simulated_plan_is_plan_epochs_and_counts_each_record_once() -> None:
    """The simulator plans ``bcl-*`` under the budget through ``plan_epoch``, the planner's one
    entry: the same micro-batches, and records used plus records left are the corpus (the
    simulator's own walk counted the records over the budget twice)."""
    from bcl_stream.planner import plan_epoch

    tok = _lengths()
    tok[::97] = T + 5  # over the budget: left out as too_long, once
    costs = resolve("llama3-8b").cost(tok)
    config = SimConfig(contract="tokens", max_tokens=T, shard_records=500)
    table = shard_table(tok, costs, config.shard_records)
    s = plan_schedules(tok, costs, table, config, ("bcl-node",))["bcl-node"]
    assert s.records_used + s.records_left == tok.size
    from bcl_stream.analysis.sim import plan_config

    whole = plan_epoch(costs, table, plan_config(config, "node"), seed=0, tokens=tok)
    assert [[p.tolist() for p in rank] for rank in s.packs] == [
        [row[row >= 0].tolist() for row in rank] for rank in whole.packs
    ]
    assert whole.remainder_counts()["longer_than_max_tokens"] == tok[::97].size
