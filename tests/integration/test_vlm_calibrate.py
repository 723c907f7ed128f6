"""``bcl-stream calibrate --dataset DIR`` on a tiny image-text dataset: image packs timed on the
tiny Qwen2-VL, both terms fitted, and the cost file taken by the tools that cost image-text
records with two terms (``simulate --cost-model FILE``); a designed pack's batch holds what its
components say, and the tiny Qwen2-VL takes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.analysis.calibrate import CalibrationConfig
from bcl_stream.analysis.calibrate_vision import (
    ImagePackConfig,
    design_image_packs,
    image_pack_batch,
)
from bcl_stream.cli import main
from bcl_stream.preprocess import preprocess
from bcl_stream.vision.cost import resolve_two_term
from tests.vlm_processors import image_text_inputs, qwen2_vl_processor_dir

pytest.importorskip("transformers")


def test_calibrate_fits_both_terms_on_an_image_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = qwen2_vl_processor_dir(tmp_path / "proc")
    files, _ = image_text_inputs(tmp_path / "in")
    data = tmp_path / "data"
    preprocess(files, str(data), processor=str(proc), progress=False)
    out, report = tmp_path / "two_term.json", tmp_path / "report.json"
    code = main(
        ["calibrate", "--dataset", str(data), "--out", str(out), "--report", str(report),
         "--packs", "15", "--pack-size", "4", "--repeats", "1", "--warmup", "1",
         "--max-tokens", "96", "--pack-tokens", "256", "--max-side", "12",
         "--pack-patches", "256", "--json"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["settings"]["model"] == "bcl_bench.tiny_vlm:TinyQwen2VL"
    assert set(summary) >= {"r2_train", "r2_holdout", "mean_rel_error_holdout"}
    model = resolve_two_term(str(out))
    assert model is not None and model.vision.unit == model.language.unit == "seconds"
    packs = json.loads(report.read_text())["packs"]
    assert len(packs) == 15
    assert any(sum(map(len, p["patches"])) == 0 for p in packs)  # text-only packs
    assert any(len(r) == 1 and len(p["patches"]) == 4 for p in packs for r in p["patches"])
    # the file costs the dataset's records with both terms in the simulator
    code = main(["simulate", "--dataset", str(data), "--ranks", "2", "--pack-size", "1",
                 "--cost-model", str(out), "--json"])  # fmt: skip
    assert code == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["config"]["cost_model"]["vision"] == model.vision.to_dict()
    assert "vision_term" not in sim["config"]["cost_model"]  # the images are costed
    assert all(s["efficiency_vision"] is not None for s in sim["strategies"].values())


def test_batch_matches_its_components_and_the_model_takes_it() -> None:
    import torch

    from bcl_bench.tiny_vlm import TinyQwen2VL

    config = CalibrationConfig(n_packs=4, pack_size=3, max_tokens=64, pack_tokens=192)
    packs = design_image_packs(config, ImagePackConfig(merge_size=2, max_side=8))
    model = TinyQwen2VL()
    for pack in packs:
        comps = pack.components(2)
        batch = image_pack_batch(
            pack,
            image_token_id=model.image_token_id,
            vision_start_id=model.vision_start_id,
            vision_end_id=model.vision_end_id,
            patch_dim=3 * 2 * 14 * 14,
            merge_size=2,
            rng=np.random.default_rng(0),
        )
        cu = batch["cu_seqlens"].tolist()
        assert np.diff(cu).tolist() == comps.tokens.tolist()
        ids = batch["input_ids"][0]
        for r in range(len(comps)):
            record = ids[cu[r] : cu[r + 1]]
            assert int((record == model.image_token_id).sum()) == comps.image_tokens[r]
        assert batch["pixel_values"].shape[0] == comps.image_patches.sum()
        assert batch["image_counts"].tolist() == comps.images_per_record.tolist()
        loss = model.loss(batch)  # Qwen2-VL checks image tokens against the encoder's features
        assert loss.ndim == 0 and torch.isfinite(loss)
