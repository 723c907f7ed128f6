"""The simulator's metrics are docs/metrics.md's definitions exactly (hand-computed tiny matrices), every
strategy accounts for every record, and ``bcl-stream simulate`` behaves as documented."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_tables import lognormal_lengths

from bcl_bench import scores as balance_scores
from bcl_stream.analysis.metrics import Metrics, imbalance_sq, metrics_from_costs
from bcl_stream.analysis.sim import (
    BUDGET_KEYS,
    STRATEGIES,
    Schedule,
    SimConfig,
    schedules,
    simulate,
    speedups,
)
from bcl_stream.analysis.terms import TERM_KEYS
from bcl_stream.cli import main
from bcl_stream.cost import get_preset

# Two ranks, two packs. Per step: mean_r = [2, 2], max_r = [3, 2], std_r = [1, 0].
# Per rank: rank 0 [1, 2] (mean 1.5, std 0.5), rank 1 [3, 2] (mean 2.5, std 0.5).
C = np.array([[1.0, 2.0], [3.0, 2.0]])


def test_metrics_match_the_hand_computed_definitions() -> None:
    m = metrics_from_costs(C, records_used=10, records_left=3)
    assert m.efficiency == pytest.approx(4 / 5)
    assert m.cv_ranks == pytest.approx((1 / 2 + 0 / 2) / 2)
    assert m.cv_time == pytest.approx((0.5 / 1.5 + 0.5 / 2.5) / 2)
    assert m.time == pytest.approx(5.0)
    assert (m.packs_per_rank, m.records_used, m.records_left) == (2, 10, 3)


def test_overhead_is_added_to_every_microbatch() -> None:
    m = metrics_from_costs(C, 0, 0, overhead=1.0)  # [[2, 3], [4, 3]]
    assert m.time == pytest.approx(4 + 3)
    assert m.efficiency == pytest.approx((3 + 3) / 7)
    assert m.cv_ranks == pytest.approx((1 / 3 + 0) / 2)


def test_step_sync_sums_the_microbatches_of_each_step_and_drops_a_partial_step() -> None:
    three = np.array([[1.0, 2.0, 50.0], [3.0, 2.0, 0.0]])  # pack 3 is a partial step (G=2)
    m = metrics_from_costs(three, 0, 0, microbatches_per_step=2, sync="step")
    # One step: rank sums [3, 5].
    assert m.time == pytest.approx(5.0)
    assert m.efficiency == pytest.approx(4 / 5)
    assert m.cv_ranks == pytest.approx(1 / 4)
    assert m.cv_time == pytest.approx(0.0)
    assert m.packs_per_rank == 3
    micro = metrics_from_costs(three, 0, 0, microbatches_per_step=2, sync="microbatch")
    assert micro.time == pytest.approx(3 + 2 + 50)


def test_step_sync_with_varying_step_sizes_sums_each_step() -> None:
    c = np.array([[1.0, 2.0, 50.0], [3.0, 2.0, 0.0]])
    m = metrics_from_costs(c, 0, 0, sync="step", step_sizes=np.array([1, 2]))
    # Steps: [1 | 2+50] and [3 | 2+0] -> max 3 + 52.
    assert m.time == pytest.approx(55.0)
    assert m.efficiency == pytest.approx((2 + 27) / 55)
    with pytest.raises(ValueError, match="sum to 3"):
        metrics_from_costs(c, 0, 0, sync="step", step_sizes=np.array([1, 1]))


def test_pooled_peers_sync_once_per_global_batch() -> None:
    planned = schedules(_lengths(), get_preset("llama3-8b"), SimConfig(window=4))
    for name in ("nemo_mffd", "verl_kk", "verl_dynbsz", "pooled_mffd_split"):
        sizes = planned[name].step_sizes
        assert sizes is not None and sizes.size == 3000 // (8 * 8 * 4), name
        assert int(sizes.sum()) == planned[name].pack_costs.shape[1], name
    assert np.all(planned["verl_kk"].step_sizes == 4)
    assert planned["bcl-world"].step_sizes is None


def test_perfect_balance_scores_one_and_zero_cv() -> None:
    m = metrics_from_costs(np.full((4, 6), 7.0), 0, 0)
    assert (m.efficiency, m.cv_ranks, m.cv_time) == (pytest.approx(1.0), 0.0, 0.0)


def test_no_packs_gives_nan_metrics_and_zero_time() -> None:
    m = metrics_from_costs(np.zeros((2, 0)), 0, 5)
    assert np.isnan(m.efficiency) and np.isnan(m.cv_ranks) and m.time == 0.0


def test_bad_sync_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="sync"):
        metrics_from_costs(C, 0, 0, sync="epoch")


@settings(max_examples=100, deadline=None)
@given(
    ranks=st.integers(1, 6),
    packs=st.integers(1, 12),
    scale=st.floats(0.01, 1e6),
    seed=st.integers(0, 2**16),
)
def test_metric_invariants(ranks: int, packs: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = rng.exponential(size=(ranks, packs)) + 1e-3
    m = metrics_from_costs(c, 0, 0)
    assert 0 < m.efficiency <= 1 + 1e-12
    assert m.efficiency * m.time == pytest.approx(c.mean(axis=0).sum())
    assert m.cv_ranks >= 0 and m.cv_time >= 0
    # Costs in other units, ranks relabelled within each step: the same balance.
    shuffled = rng.permuted(c, axis=0)
    for other in (metrics_from_costs(c * scale, 0, 0), metrics_from_costs(shuffled, 0, 0)):
        assert other.efficiency == pytest.approx(m.efficiency)
        assert other.cv_ranks == pytest.approx(m.cv_ranks)
    assert metrics_from_costs(shuffled, 0, 0).time == pytest.approx(m.time)


def _lengths(n: int = 3000, seed: int = 0) -> np.ndarray:
    return lognormal_lengths(n, seed)


@pytest.mark.parametrize("ranks_per_node", [8, 4])
def test_every_strategy_accounts_for_every_record_and_its_cost(ranks_per_node: int) -> None:
    tok = _lengths()
    model = get_preset("llama3-8b")
    config = SimConfig(ranks=8, ranks_per_node=ranks_per_node, window=4)
    total = float(model.cost(tok).sum())
    planned = schedules(tok, model, config)
    assert tuple(planned) == STRATEGIES
    for name, s in planned.items():
        assert s.records_used + s.records_left == tok.size, name
        assert s.pack_costs.shape[0] == 8, name
        assert s.pack_costs.sum() <= total * (1 + 1e-12), name
    # These emit exactly B records per pack; so the used cost is that of B*packs.
    for name in ("sequential", "verl_kk", "bcl-rank", "bcl-node", "bcl-world"):
        assert planned[name].records_used == planned[name].pack_costs.size * config.pack_size


def test_simulate_scores_the_schedules_with_the_same_metrics() -> None:
    tok = _lengths()
    model = get_preset("llama3-8b")
    config = SimConfig(window=4, sync="step", overhead=1e9)
    planned = schedules(tok, model, config)
    scored = simulate(tok, model, config)
    for name, s in planned.items():
        expected = metrics_from_costs(
            s.pack_costs,
            s.records_used,
            s.records_left,
            overhead=1e9,
            microbatches_per_step=config.grad_accum,
            sync="step",
            step_sizes=s.step_sizes,
        )
        fixed = {"download_amplification": 0.0, "imbalance_sq": 0.0}
        moved = {"displacement_steps_mean": 0.0, "displacement_steps_max": 0.0}
        assert dataclasses.replace(scored[name], shard_working_set=0, **fixed, **moved) == (
            dataclasses.replace(expected, **fixed, **moved)
        )
        assert scored[name].imbalance_sq >= 1.0
        assert scored[name].download_amplification >= 1.0
        assert scored[name].shard_working_set >= 1


def test_unknown_strategy_and_bad_tokens_are_value_errors() -> None:
    model = get_preset("tokens")
    with pytest.raises(ValueError, match="unknown strategy"):
        schedules(_lengths(100), model, SimConfig(), ("magic",))
    with pytest.raises(ValueError, match=r"renamed pooled_mffd_split.*nemo_mffd"):
        schedules(_lengths(100), model, SimConfig(), ("pooled_mffd",))
    with pytest.raises(ValueError, match=">= 0"):
        schedules(np.array([5, -1, 3]), model, SimConfig())
    with pytest.raises(ValueError, match="non-empty"):
        schedules(np.array([], dtype=np.int64), model, SimConfig())


def test_cli_json_prints_exactly_one_object_with_the_documented_keys(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--lengths", str(lengths_file), "--window", "4", "--json"]
    assert main(args) == 0
    out = capsys.readouterr().out
    payload = json.loads(out)  # raises if anything but one JSON document was printed
    assert out.strip().count("\n") == 0
    assert set(payload) == {"config", "efficiency_is", "strategies", "speedup_vs"}
    assert payload["efficiency_is"] == "per micro-batch"
    assert set(payload["strategies"]) == set(STRATEGIES)
    assert set(payload["speedup_vs"]) == set(STRATEGIES)
    for peer in ("nemo_mffd", "verl_kk", "hf_rebalance"):
        assert payload["speedup_vs"][peer][peer] == pytest.approx(1.0)
    fields = {f.name for f in dataclasses.fields(Metrics)}
    labelled = {"efficiency_per_micro_batch", "efficiency_per_step"}
    for metrics in payload["strategies"].values():
        assert set(metrics) == fields | set(BUDGET_KEYS) | labelled | set(TERM_KEYS)
        assert metrics["efficiency_vision"] is None  # text only: no vision term, not 1.0
    config = payload["config"]
    extra = {"cost_model", "records", "shards", "nodes", "node_layout"}
    assert set(SimConfig.__slots__) | extra == set(config)
    assert config["records"] == 2048 and config["window"] == 4
    assert config["nodes"] == 1 and config["shards"] == 1  # --ranks 8 alone: one node of 8
    assert config["node_layout"] == "1 node x 8 ranks (world 8)"
    assert config["cost_model"]["name"] == "llama3-8b"
    cli_defaults = SimConfig(window=4, ranks_per_node=8, grad_accum=1)
    direct = simulate(np.load(lengths_file), get_preset("llama3-8b"), cli_defaults)
    for name, m in direct.items():
        row = payload["strategies"][name]
        got = {k: float("nan") if row[k] is None else row[k] for k in fields}
        assert got == pytest.approx(m.to_dict(), nan_ok=True)  # JSON writes NaN as null


def test_cli_strategies_flag_limits_the_output(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--lengths", str(lengths_file), "--strategies", "sequential,bcl-world"]
    assert main([*args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["strategies"]) == {"sequential", "bcl-world"}
    assert "speedup_vs" not in payload  # no peer planned, nothing to compare against
    assert main([*args[:-1], "verl_kk,bcl-world"]) == 0
    header = capsys.readouterr().out.splitlines()[1]  # after the set-up line
    assert header.split()[-2:] == ["vs", "verl_kk"] and "nemo_mffd" not in header


def test_imbalance_sq_is_torchtitans_mean_of_max_over_mean_of_squared_lengths() -> None:
    # Micro-batch 0: S = [1 + 9, 4 + 4] -> max/mean = 10 / 9; micro-batch 1: [4, 4] -> 1.
    sq = np.array([[1.0 + 9.0, 4.0], [4.0 + 4.0, 4.0]])
    assert imbalance_sq(sq) == pytest.approx((10 / 9 + 1.0) / 2)
    assert imbalance_sq(np.zeros((2, 3))) != imbalance_sq(np.zeros((2, 3)))  # NaN: no tokens
    tok = np.array([1, 3, 2, 2, 2, 2, 2, 2], dtype=np.int64)
    config = SimConfig(ranks=2, ranks_per_node=2, pack_size=2, grad_accum=1, window=1)
    packs = schedules(tok, get_preset("tokens"), config, ("sequential",))["sequential"].packs
    expected = imbalance_sq(np.array([[float(np.sum(tok[p] ** 2)) for p in r] for r in packs]))
    scored = simulate(tok, get_preset("tokens"), config, ("sequential",))
    assert scored["sequential"].imbalance_sq == pytest.approx(expected)


def test_speedup_vs_a_peer_is_time_per_unit_of_cost() -> None:
    config = SimConfig(ranks=2, grad_accum=1)
    peer = Schedule(np.array([[1.0, 2, 1, 2], [3, 2, 3, 2]]), 8, 0)  # T 10 for 16 units
    half = Schedule(np.full((2, 2), 1.0), 4, 4)  # T 2 for 4 units
    got = speedups({"verl_kk": peer, "x": half}, config)
    assert got["x"] == {"verl_kk": pytest.approx((10 / 16) / (2 / 4))}
    assert got["verl_kk"] == {"verl_kk": pytest.approx(1.0)}
    assert speedups({"x": half}, config) == {"x": {}}
    # Padded: per unit of the records' own cost; computing padding earns nothing.
    padded = Schedule(np.full((2, 2), 2.0), 4, 4, useful_costs=np.full((2, 2), 1.0))
    assert speedups({"verl_kk": peer, "x": padded}, config)["x"] == {
        "verl_kk": pytest.approx((10 / 16) / (4 / 4))
    }


def test_cli_table_lists_every_strategy(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--lengths", str(lengths_file)]) == 0
    setup, *rows = capsys.readouterr().out.splitlines()
    assert setup.startswith("records 2048 in 1 shards; node layout: 1 node x 8 ranks (world 8);")
    assert rows[0].split()[:3] == ["strategy", "eff/mb", "eff/step"]
    assert [row.split()[0] for row in rows[1:-1]] == list(STRATEGIES)
    assert rows[-1].startswith("eff/mb: balance efficiency per micro-batch")
    assert "eff/step: per optimizer step of G=1 micro-batches" in rows[-1]


@pytest.mark.parametrize("sync", ["microbatch", "step"])
def test_simulate_labels_efficiency_per_micro_batch_and_per_step(
    lengths_file: Path, capsys: pytest.CaptureFixture[str], sync: str
) -> None:
    names = ("sequential", "bcl-node")
    args = ["simulate", "--lengths", str(lengths_file), "--ranks", "4", "--ranks-per-node", "4"]
    args += ["--grad-accum", "4", "--window", "4", "--strategies", ",".join(names)]
    assert main([*args, "--sync", sync, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (
        payload["efficiency_is"]
        == {"microbatch": "per micro-batch", "step": "per optimizer step"}[sync]
    )
    config = SimConfig(ranks=4, ranks_per_node=4, grad_accum=4, window=4)
    planned = schedules(np.load(lengths_file), get_preset("llama3-8b"), config, names)
    for name, s in planned.items():
        c = s.pack_costs  # (ranks, micro-batches); the oracle sums each step's 4 first
        steps = c[:, : c.shape[1] // 4 * 4].reshape(4, -1, 4).sum(axis=2)
        micro = c.mean(axis=0).sum() / c.max(axis=0).sum()
        per_step = steps.mean(axis=0).sum() / steps.max(axis=0).sum()
        got = payload["strategies"][name]
        assert got["efficiency_per_micro_batch"] == pytest.approx(micro)
        assert got["efficiency_per_step"] == pytest.approx(per_step)
        assert got["efficiency"] == pytest.approx(micro if sync == "microbatch" else per_step)
    assert micro != pytest.approx(per_step)  # the two figures differ here: the labels matter
    assert main([*args, "--sync", sync]) == 0
    *_, legend = capsys.readouterr().out.splitlines()
    assert legend.endswith(f"(--sync {sync})")


def test_cli_plot_writes_a_png(lengths_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "sub" / "steps.png"
    assert main(["simulate", "--lengths", str(lengths_file), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "text.npy"
    text.write_text("not numpy")
    floats, matrix, empty = tmp_path / "f.npy", tmp_path / "m.npy", tmp_path / "e.npy"
    np.save(floats, np.array([1.5, 2.0]))
    np.save(matrix, np.ones((2, 2), dtype=np.int64))
    np.save(empty, np.array([], dtype=np.int64))
    return {
        "missing": tmp_path / "nope.npy",
        "text": text,
        "floats": floats,
        "matrix": matrix,
        "empty": empty,
        "directory": tmp_path,
    }


@pytest.mark.parametrize("case", ["missing", "text", "floats", "matrix", "empty", "directory"])
def test_cli_bad_lengths_file_is_a_clear_error_with_exit_code_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_inputs(tmp_path)[case]
    assert main(["simulate", "--lengths", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("bcl-stream simulate: error:")
    assert str(path) in captured.err
    assert captured.err.count("\n") == 1


def test_cli_bad_lengths_as_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    path = _bad_inputs(tmp_path)["text"]
    proc = subprocess.run(
        [sys.executable, "-m", "bcl_stream.cli", "simulate", "--lengths", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"--lengths {path}" in proc.stderr


def test_bench_speedup_is_time_per_unit_cost_and_cv_reduction_is_vs_sequential() -> None:
    from bcl_stream.analysis.sim import Schedule

    bench = balance_scores
    assert bench.ACCUM == 4
    # sequential: per micro-batch T = 3+2+3+2 = 10 for 16 cost units; per step rank sums [6, 10].
    seq = Schedule(np.array([[1.0, 2, 1, 2], [3, 2, 3, 2]]), 8, 0)
    flat = Schedule(np.full((2, 4), 2.0), 8, 0)  # T = 8 for the same 16 units
    half = Schedule(np.full((2, 4), 1.0), 4, 4)  # T = 4 for 8 units: same time per unit
    base = {"sequential": seq}
    for s in (flat, half):
        scores = bench.score(s, base)
        assert scores["speedup_vs_sequential"] == pytest.approx((10 / 16) / (4 / 8))
        assert scores["speedup_vs_sequential_step"] == pytest.approx((10 / 16) / (4 / 8))
        assert scores["cv_reduction"] == pytest.approx(1.0)
        assert scores["efficiency"] == pytest.approx(1.0)
    own = bench.score(seq, base)
    assert own["speedup_vs_sequential"] == pytest.approx(1.0)
    assert own["cv_reduction"] == pytest.approx(0.0)
    assert own["efficiency"] == pytest.approx(16 / 2 / 10)
    assert own["cv_ranks_step"] == pytest.approx(2 / 8)


def test_sequential_stays_the_record_contract_loader_under_the_token_budget() -> None:
    """``sequential`` is the plain loader of B records per micro-batch whatever the contract
    (the module docstring): under ``contract="tokens"`` it plans, and plans what it plans under
    the record contract (it used to fail asking for the max_tokens it was given)."""
    tok = _lengths(4096)
    model = get_preset("llama3-8b")
    pack = SimConfig(ranks=8, window=4, grad_accum=1, max_tokens=16384)
    tokens = dataclasses.replace(pack, contract="tokens")
    under_tokens = schedules(tok, model, tokens, ("sequential",))["sequential"]
    under_pack = schedules(tok, model, pack, ("sequential",))["sequential"]
    np.testing.assert_array_equal(np.asarray(under_tokens.packs), np.asarray(under_pack.packs))
    assert under_tokens.records_used == under_pack.records_used > 0
