"""Image packs for the two-term calibration: their design separates the terms (times planted
from known coefficients on the designed packs are fitted back to them, with and without a
dataset's records) and are well formed (the batches and the model: test_vlm_calibrate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bcl_stream.analysis.calibrate import CalibrationConfig
from bcl_stream.analysis.calibrate_vision import (
    ImagePackConfig,
    design_image_packs,
    grid_of,
)
from bcl_stream.cost import CostModel
from bcl_stream.vision.components import RecordComponents
from bcl_stream.vision.cost import TwoTermCost, VisionCost, fit_two_term_cost

TRUTH = TwoTermCost(
    name="truth",
    vision=VisionCost(name="v", a=2e-6, b=3e-9, k=4e-4, unit="seconds"),
    language=CostModel(name="l", a=5e-6, b=2e-9, k=1e-3, unit="seconds"),
)
IMAGES = ImagePackConfig(merge_size=2, max_side=64, pack_patches=8192)


def _dataset() -> RecordComponents:
    """Records as a preprocessed dataset stores them: text tokens, Qwen2-VL patch counts."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(200):
        sides = [(2 * int(rng.integers(2, 40)), 2 * int(rng.integers(2, 40))) for _ in range(i % 3)]
        patches = [h * w for h, w in sides]
        rows.append((int(rng.integers(20, 900)), sum(p // 4 for p in patches), patches))
    return RecordComponents.build(rows)


@pytest.mark.parametrize("dataset", [False, True])
def test_designed_packs_recover_planted_coefficients(dataset: bool) -> None:
    config = CalibrationConfig(n_packs=96, pack_size=8, max_tokens=1024, pack_tokens=4096)
    packs = design_image_packs(config, IMAGES, _dataset() if dataset else None)
    comps = [p.components(2) for p in packs]
    rng = np.random.default_rng(1)
    seconds = [TRUTH.cost(c).sum() * (1 + 0.001 * rng.standard_normal()) for c in comps]
    got = fit_two_term_cost(comps, seconds, name="fit").model
    for mine, want in (
        (got.vision.a, TRUTH.vision.a),
        (got.vision.b, TRUTH.vision.b),
        (got.vision.k, TRUTH.vision.k),
        (got.language.a, TRUTH.language.a),
        (got.language.b, TRUTH.language.b),
        (got.language.k, TRUTH.language.k),
    ):
        assert mine == pytest.approx(want, rel=0.05)


def test_designed_packs_are_well_formed() -> None:
    config = CalibrationConfig(n_packs=40, pack_size=4)
    small = ImagePackConfig(merge_size=2, max_side=16, pack_patches=300)
    packs = design_image_packs(config, small, _dataset())
    kinds = set()
    for pack in packs:
        assert len(pack.text) == len(pack.grids) == 4
        grids = [g for record in pack.grids for g in record]
        assert all(h % 2 == 0 and w % 2 == 0 and 2 <= h <= 16 and 2 <= w <= 16 for h, w in grids)
        assert sum(h * w for h, w in grids) <= 300
        assert all(t >= 2 * len(g) + 1 for t, g in zip(pack.text, pack.grids, strict=True))
        kinds.add((len(grids) == 0, len(grids) == 4 and len(set(map(len, pack.grids))) == 1))
    assert (True, False) in kinds and (False, True) in kinds  # text-only and one-per-record packs


def test_grid_of_factors_patch_counts() -> None:
    assert grid_of(24 * 36, 2, 64) == (24, 36)
    assert grid_of(4, 2, 64) == (2, 2)
    assert grid_of(20 * 20, 2, 64) == (20, 20)  # the most square factoring
    assert grid_of(4 * 97, 2, 32) == (2, 32)  # 2 x 194 is wider than 32: scaled to fit
    assert grid_of(100 * 100, 2, 32) == (32, 32)
