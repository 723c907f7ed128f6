"""Image geometry is exactly the Hugging Face processors' own: Qwen2-VL's ``image_grid_thw``
(dynamic resolution) and LLaVA-1.5's fixed tile, run on synthetic pixels of many sizes (tiny,
huge, extreme aspect ratios), plus the arithmetic against transformers' ``smart_resize`` on a
dense grid of sizes, and the refusals (aspect > 200, zero side, unsupported config)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bcl_stream.errors import DatasetError
from bcl_stream.vision.geometry import (
    ImageGeometry,
    ImageSizeError,
    from_preprocessor_config,
    llava,
    qwen2_vl,
)

transformers = pytest.importorskip("transformers")
from transformers import Qwen2VLImageProcessor  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # noqa: E402

SMALL_BOUNDS = (4 * 28 * 28, 64 * 28 * 28)
"""min/max pixels of a small Qwen2-VL processor: 4 to 64 LM tokens, so real runs stay fast."""
SIZES = [
    (1, 1),
    (1, 2),
    (2, 1),
    (13, 27),
    (28, 28),
    (27, 29),
    (41, 14),
    (56, 56),
    (100, 3),
    (3, 600),
    (199, 1),
    (1, 200),
    (200, 1),
    (14, 2800),
    (2800, 14),
    (224, 224),
    (333, 500),
    (640, 480),
    (1023, 767),
    (1024, 768),
    (1280, 720),
    (1920, 1080),
    (600, 3),
    (3000, 2000),
    (4000, 20),
]
"""(width, height): tiny, square, just off multiples of 28, aspect ratios up to the 200 limit,
huge. Run through the real processor (pixels resized), so kept to a few million pixels each."""


def _pixels(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB PIL image of random pixels. Callers pass ``input_data_format="channels_last"``:
    transformers otherwise guesses the channel axis, wrongly for images 1 or 3 px high."""
    rng = np.random.default_rng(seed + width * 7919 + height)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("bounds", [SMALL_BOUNDS, (56 * 56, 28 * 28 * 1280)])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen2_vl_grid_matches_the_processor(
    width: int, height: int, bounds: tuple[int, int]
) -> None:
    lo, hi = bounds
    if hi > SMALL_BOUNDS[1] and width * height > 2_000_000:
        pytest.skip("the default bounds run only on the smaller sizes (resize time)")
    proc = Qwen2VLImageProcessor(min_pixels=lo, max_pixels=hi)
    out = proc(
        images=[_pixels(width, height)], return_tensors="np", input_data_format="channels_last"
    )
    want = tuple(int(v) for v in out["image_grid_thw"][0])
    geo = qwen2_vl(min_pixels=lo, max_pixels=hi)
    assert geo.grid(width, height) == want
    assert geo.patches(width, height) == out["pixel_values"].shape[0] == math.prod(want)
    assert geo.tokens(width, height) == math.prod(want) // 4


def test_qwen2_vl_arithmetic_matches_smart_resize_on_a_dense_grid() -> None:
    """Every (w, h) of a grid from 1 px to 40,000 px on a side (no pixels: the resize itself
    is transformers' function, called with the processor's factor and bounds)."""
    sides = sorted(
        {1, 2, 3, 13, 14, 15, 27, 28, 29, 55, 56, 57, 83, 84, 85, 111, 112}
        | {int(v) for v in np.geomspace(1, 40_000, 120)}
    )
    for lo, hi in (SMALL_BOUNDS, (56 * 56, 28 * 28 * 1280), (256 * 28 * 28, 16384 * 28 * 28)):
        geo = qwen2_vl(min_pixels=lo, max_pixels=hi)
        checked = 0
        for w in sides:
            for h in sides:
                if max(w, h) / min(w, h) > 200:
                    continue
                rh, rw = smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
                assert geo.resized(w, h) == (rw, rh), (w, h, lo, hi)
                assert geo.grid(w, h) == (1, rh // 14, rw // 14)
                checked += 1
        assert checked > 5000


@pytest.mark.parametrize(("width", "height"), [(201, 1), (1, 201), (4021, 20), (20, 4001)])
def test_aspect_above_200_is_refused_as_the_processor_refuses(width: int, height: int) -> None:
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(height, width, factor=28)
    with pytest.raises(ImageSizeError, match=r"aspect ratio .* above 200.*crop or pad"):
        qwen2_vl().tokens(width, height)


@pytest.mark.parametrize(("width", "height"), [(0, 10), (10, 0), (0, 0)])
def test_a_zero_side_is_refused(width: int, height: int) -> None:
    for geo in (qwen2_vl(), llava()):
        with pytest.raises(ImageSizeError, match="a side is zero"):
            geo.grid(width, height)


def _llava_processor(root: Path) -> object:
    from transformers import AutoProcessor

    from tests.vlm_processors import llava_processor_dir

    return AutoProcessor.from_pretrained(str(llava_processor_dir(root)))


def test_llava_fixed_tile_matches_the_processor(tmp_path: Path) -> None:
    proc = _llava_processor(tmp_path)
    geo = from_preprocessor_config(tmp_path)
    assert geo == llava()
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    for width, height in [(1, 1), (13, 900), (336, 336), (640, 480), (2000, 30), (30, 2000)]:
        out = proc(
            text="look <image> here",
            images=[_pixels(width, height)],
            return_tensors="np",
            input_data_format="channels_last",
        )
        assert out["pixel_values"].shape == (1, 3, 336, 336)
        assert int((out["input_ids"][0] == image_id).sum()) == geo.tokens(width, height) == 576
        assert geo.grid(width, height) == (1, 24, 24)
        assert geo.patches(width, height) == 576


@pytest.mark.parametrize("use_fast", [False, True])
def test_qwen2_vl_config_is_read_as_the_loaded_processor_uses_it(
    tmp_path: Path, use_fast: bool
) -> None:
    """Saved and loaded back (AutoImageProcessor loads the fast one by default in 4.57):
    both read the file's bounds as the geometry does."""
    Qwen2VLImageProcessor(min_pixels=3136, max_pixels=50176).save_pretrained(str(tmp_path))
    loaded = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), use_fast=use_fast)
    geo = from_preprocessor_config(tmp_path / "preprocessor_config.json")
    assert geo == qwen2_vl(min_pixels=3136, max_pixels=50176)
    for width, height in [(1, 3), (5, 7), (640, 480), (3000, 40), (40, 3000)]:
        # The fast processor turns a PIL image into channels-first itself; the slow one needs
        # the hint.
        hint = {} if use_fast else {"input_data_format": "channels_last"}
        out = loaded(images=[_pixels(width, height)], return_tensors="pt", **hint)
        assert geo.grid(width, height) == tuple(int(v) for v in out["image_grid_thw"][0])
        assert geo.patches(width, height) == out["pixel_values"].shape[0]


def test_round_trip_through_json() -> None:
    for geo in (qwen2_vl(), llava()):
        assert ImageGeometry.from_dict(json.loads(json.dumps(geo.to_dict()))) == geo


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"image_processor_type": "SiglipImageProcessor"}, "is not supported"),
        (
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "min_pixels": 10,
                "size": {"shortest_edge": 20, "longest_edge": 9999},
            },
            "disagree",
        ),
        ({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": "14"}, "not an integer"),
        ({"image_processor_type": "Qwen2VLImageProcessor", "do_resize": False}, "do_resize"),
        ({"image_processor_type": "CLIPImageProcessor", "crop_size": 336}, "processor_config.json"),
    ],
)
def test_bad_configs_are_refused_naming_the_file(tmp_path: Path, doc: dict, match: str) -> None:
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=match) as info:
        from_preprocessor_config(tmp_path)
    assert str(path) in str(info.value)


def test_missing_and_broken_config_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found; --processor"):
        from_preprocessor_config(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(DatasetError, match="unreadable JSON"):
        from_preprocessor_config(tmp_path)
