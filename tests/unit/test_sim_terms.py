"""Per-term balance (``analysis/terms.py``): hand-computed matrices, text-only data reported
without a vision term, and ``simulate --json`` carrying both terms beside ``efficiency``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bcl_stream.analysis.sim import SimConfig, plan_schedules, score, shard_table
from bcl_stream.analysis.terms import term_figures
from bcl_stream.cli import main
from bcl_stream.cost import get_preset
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.index import CostIndex, ShardEntry, read_index, write_index
from bcl_stream.planner.shard_table import ShardTable, shard_weights
from bcl_stream.vision.components import COMPONENTS_KEY, RecordComponents, write_components
from bcl_stream.vision.cost import get_two_term_preset

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


def _image_text_index(root: Path, n: int = 512, seed: int = 0) -> RecordComponents:
    """An image-text cost index with its components: every other record has one image of
    varied size (Qwen2-VL: tokens = patches / 4), the rest are text only."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        patches = [int(rng.integers(16, 4096)) // 4 * 4] if i % 2 == 0 else []
        rows.append((int(rng.integers(8, 1024)), sum(patches) // 4, patches))
    comps = RecordComponents.build(rows)
    extra = {COMPONENTS_KEY: write_components(root, comps)}
    counts = [n // 2, n - n // 2]
    shards = [ShardEntry(f"s{i}", c) for i, c in enumerate(counts)]
    write_index(root, CostIndex.build(comps.tokens, get_preset("tokens"), shards, "mds", extra))
    return comps


def _simulate(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["simulate", *args, "--json", "--strategies", "sequential,bcl-world"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_dataset_reports_the_vision_term_under_a_two_term_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    comps = _image_text_index(tmp_path)
    payload = _simulate(["--dataset", str(tmp_path), "--cost-model", "qwen2-vl-7b"], capsys)
    assert payload["config"]["cost_model"]["name"] == "qwen2-vl-7b"
    model = get_two_term_preset("qwen2-vl-7b")
    vision, language = model.terms(comps)
    for row in payload["strategies"].values():
        assert 0 < row["efficiency_vision"] <= 1
        assert 0 < row["efficiency_language"] <= 1
        assert row["efficiency_vision"] != pytest.approx(row["efficiency_language"])
    # bcl-world is what the readers yield under the same model: the language term planned,
    # then refined (epoch/terms.py); scored by hand on the readers' own whole-epoch plan
    config = ReaderConfig.build(
        world_size=8, ranks_per_node=8, grad_accum=1, window=16, scope="world",
        cost_model="qwen2-vl-7b",
    )  # fmt: skip
    readers = full_plan(read_index(tmp_path), config, 0).plan.packs
    got = term_figures(readers, vision, language)
    row = payload["strategies"]["bcl-world"]
    assert row["efficiency_vision"] == pytest.approx(got["efficiency_vision"])
    assert row["efficiency_language"] == pytest.approx(got["efficiency_language"])
    assert row["efficiency"] == pytest.approx(got["efficiency_summed"])
    # and it is not the summed cost's plan, unrefined (what simulate showed before)
    costs = vision + language
    table = ShardTable.build([256, 256], weight=shard_weights([256, 256], costs))
    sim = SimConfig(ranks=8, ranks_per_node=8, grad_accum=1, window=16)
    summed = plan_schedules(comps.tokens, costs, table, sim, ("bcl-world",))["bcl-world"]
    assert term_figures(summed.packs, vision, language) != got


def test_simulate_dataset_without_a_two_term_model_says_the_vision_term_is_not_modeled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _image_text_index(tmp_path)
    payload = _simulate(["--dataset", str(tmp_path)], capsys)
    assert "not modeled" in payload["config"]["cost_model"]["vision_term"]
    for row in payload["strategies"].values():
        assert row["efficiency_vision"] is None


def test_simulate_text_only_dataset_under_a_two_term_model_has_no_vision_term(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = np.random.default_rng(2).integers(8, 2048, 512)
    shards = [ShardEntry("s0", 256), ShardEntry("s1", 256)]
    write_index(tmp_path, CostIndex.build(tokens, get_preset("tokens"), shards, "mds", {}))
    payload = _simulate(["--dataset", str(tmp_path), "--cost-model", "qwen2-vl-2b"], capsys)
    assert payload["config"]["cost_model"]["vision_term"] == "none: text-only data"
    for row in payload["strategies"].values():
        assert row["efficiency_vision"] is None
        assert row["efficiency_language"] == pytest.approx(row["efficiency"])


def test_image_tokens_count_toward_the_token_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records of 16 text tokens and one image of 256 tokens (1024 patches): under a budget of
    T = 1024 a micro-batch holds at most 3 of them (3 x 272 = 816; 4 x 272 = 1088 > T), never
    the 64 their text alone would allow."""
    n = 960
    comps = RecordComponents.build([(16, 256, [1024])] * n)
    extra = {COMPONENTS_KEY: write_components(tmp_path, comps)}
    shards = [ShardEntry("s0", n // 2), ShardEntry("s1", n // 2)]
    write_index(tmp_path, CostIndex.build(comps.tokens, get_preset("tokens"), shards, "mds", extra))
    args = ["simulate", "--dataset", str(tmp_path), "--cost-model", "qwen2-vl-2b", "--json"]
    args += ["--contract", "tokens", "--max-tokens", "1024", "--strategies", "bcl-world"]
    assert main(args) == 0
    row = json.loads(capsys.readouterr().out)["strategies"]["bcl-world"]
    assert row["micro_batch_tokens"]["max"] == 816
    assert row["records_used"] > 0
    per_rank = row["micro_batches_per_rank"]["max"]
    assert per_rank >= row["records_used"] / (8 * 3)
