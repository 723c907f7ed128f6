"""Per-term balance (``analysis/terms.py``): hand-computed matrices, text-only data reported
without a vision term, and ``simulate --json`` carrying both terms beside ``efficiency``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.analysis.sim import SimConfig, plan_schedules, score, shard_table
from bcl_stream.analysis.terms import term_figures
from bcl_stream.cli import main
from bcl_stream.cost import get_preset

# Two ranks, two micro-batches, records 0..3: rank 0 runs [0], [1]; rank 1 runs [2], [3].
PACKS = [[np.array([0]), np.array([1])], [np.array([2]), np.array([3])]]
VISION = np.array([4.0, 0.0, 0.0, 4.0])
LANGUAGE = np.array([1.0, 5.0, 5.0, 1.0])


def test_a_pack_balanced_in_sum_can_leave_the_vision_stage_unbalanced() -> None:
    """Each micro-batch sums to 5 on both ranks (summed efficiency 1), yet at each one a single
    rank encodes an image: the vision stage runs at 1/2, the language one at 6/10."""
    got = term_figures(PACKS, VISION, LANGUAGE)
    assert got["efficiency_summed"] == pytest.approx(1.0)
    # vision: t0 ranks (4, 0): mean 2, max 4; t1 (0, 4): mean 2, max 4 -> 4 / 8
    assert got["efficiency_vision"] == pytest.approx(0.5)
    # language: t0 (1, 5): mean 3, max 5; t1 (5, 1) -> 6 / 10
    assert got["efficiency_language"] == pytest.approx(0.6)
    # separate stages: (4 + 5) + (4 + 5) = 18; one stage: 5 + 5 = 10
    assert got["time_separate_stages"] == pytest.approx(18.0)
    assert got["time_one_stage"] == pytest.approx(10.0)
    # perfectly balanced terms: (2 + 3) + (2 + 3) = 10
    assert got["time_balanced_stages"] == pytest.approx(10.0)


def test_per_step_sync_sums_the_micro_batches_first() -> None:
    """Synced once per step of G=2, each rank's vision is 4 and language 6: all even."""
    got = term_figures(PACKS, VISION, LANGUAGE, sync="step", microbatches_per_step=2)
    assert got["efficiency_vision"] == pytest.approx(1.0)
    assert got["efficiency_language"] == pytest.approx(1.0)


def test_text_only_has_no_vision_term() -> None:
    got = term_figures(PACKS, None, LANGUAGE)
    assert got["efficiency_vision"] is None
    assert got["efficiency_language"] == pytest.approx(0.6)
    assert got["time_separate_stages"] == got["time_one_stage"] == pytest.approx(10.0)


def test_vision_is_never_padded() -> None:
    """Under the padded layout the language term is B x its longest record; images are encoded
    at their own sizes, so the vision term stays the sum."""
    packs = [[np.array([0, 1])], [np.array([2, 3])]]
    got = term_figures(packs, VISION, LANGUAGE, layout="padded")
    assert got["efficiency_vision"] == pytest.approx(1.0)  # 4 and 4
    assert got["efficiency_language"] == pytest.approx(1.0)  # 2 x 5 on both ranks


def test_language_efficiency_of_text_only_equals_the_summed_efficiency() -> None:
    """On text-only data the language term is the whole cost: its efficiency is ``efficiency``."""
    rng = np.random.default_rng(0)
    tok = rng.lognormal(5.5, 1.0, 4096).astype(np.int64) + 1
    costs = get_preset("llama3-8b").cost(tok)
    config = SimConfig(ranks=8, window=8, grad_accum=1)
    table = shard_table(tok, costs, 1024)
    planned = plan_schedules(tok, costs, table, config, ("sequential", "bcl-world"))

    scored = score(planned, config)
    for name, s in planned.items():
        got = term_figures(s.packs, None, costs)
        assert got["efficiency_language"] == pytest.approx(scored[name].efficiency)


def test_simulate_json_reports_both_terms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.random.default_rng(1).integers(16, 2048, 1024))
    assert main(["simulate", "--lengths", str(lengths), "--json", "--strategies", "bcl-world"]) == 0
    row = json.loads(capsys.readouterr().out)["strategies"]["bcl-world"]
    assert row["efficiency_vision"] is None
    assert row["efficiency_language"] == pytest.approx(row["efficiency"])
