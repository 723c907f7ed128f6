"""Image size -> vision-encoder patches and language-model tokens, per model family.

Why: an image's cost is known before it is decoded. Its width and height come from the file's
header, and a model's processor turns them into a patch grid by arithmetic alone. The cost
index can therefore store each image's patches and tokens when the shards are written, and the
planner can balance them without touching a pixel.

The arithmetic must be *exactly* the processor's, or the stored token counts (and the ids with
the image tokens expanded) disagree with what the model is given. Two families:

- ``qwen2_vl`` (dynamic resolution; Qwen2-VL, Qwen2.5-VL's image path): the image is resized
  to the nearest multiple of ``patch_size * merge_size`` on each side with its pixel count kept
  within ``[min_pixels, max_pixels]`` (transformers' ``smart_resize``, reproduced operation by
  operation, floats and banker's rounding included). The grid is ``(t, gh, gw) =
  (1, h / patch, w / patch)`` for an image (one frame, repeated to ``temporal_patch_size``);
  the encoder sees ``t * gh * gw`` patches and the language model ``t*gh*gw / merge_size**2``
  tokens. An aspect ratio above 200 is refused, as the processor refuses it.
- ``fixed`` (fixed tile; LLaVA-1.5 with a CLIP processor): every image is resized and
  center-cropped to ``crop_height x crop_width``; the grid is ``(1, crop_h / patch,
  crop_w / patch)`` whatever the input size, and the tokens are that grid plus
  ``num_additional_image_tokens``, less the CLS feature the ``default`` feature-select
  strategy drops (LLaVA-1.5 at 336 px, patch 14: 576 tokens).

:func:`from_preprocessor_config` reads a model's ``preprocessor_config.json`` (and, for the
fixed family, the ``processor_config.json`` beside it that holds the patch size). The tests
compare every family with the real Hugging Face processor on many sizes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bcl_stream.errors import DatasetError

QWEN2_VL_MIN_PIXELS = 56 * 56
"""transformers' default ``min_pixels`` (``size.shortest_edge``) of ``Qwen2VLImageProcessor``."""
QWEN2_VL_MAX_PIXELS = 28 * 28 * 1280
"""transformers' default ``max_pixels`` (``size.longest_edge``): 1280 LM tokens at most."""
MAX_ASPECT = 200
"""The processor refuses ``max(w, h) / min(w, h) > 200`` (``smart_resize``); so do we."""
FAMILIES = ("qwen2_vl", "fixed")
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"
_QWEN2_VL_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
_FIXED_PROCESSORS = ("CLIPImageProcessor", "CLIPImageProcessorFast")


class ImageSizeError(DatasetError):
    """An image whose size the model's processor refuses (zero side, aspect ratio above 200)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageGeometry:
    """How one model family turns an image's (width, height) into patches and tokens."""

    family: str
    """``qwen2_vl`` (dynamic resolution) or ``fixed`` (one tile of ``crop_*`` pixels)."""
    patch_size: int = 14
    """Side of one encoder patch, in pixels."""
    merge_size: int = 1
    """Patches merged into one LM token per side (Qwen2-VL: 2, so 4 patches -> 1 token)."""
    temporal_patch_size: int = 1
    """Frames per patch (Qwen2-VL: 2; an image's one frame is repeated to fill it)."""
    min_pixels: int = 0
    """``qwen2_vl``: the smallest pixel count an image is resized to."""
    max_pixels: int = 0
    """``qwen2_vl``: the largest pixel count an image is resized to."""
    crop_height: int = 0
    """``fixed``: the tile's height in pixels."""
    crop_width: int = 0
    """``fixed``: the tile's width in pixels."""
    extra_tokens: int = 0
    """``fixed``: LM tokens beside the patch grid (``num_additional_image_tokens``, less the CLS
    feature the ``default`` feature-select strategy drops; LLaVA-1.5: 1 - 1 = 0)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r}: expected one of {FAMILIES}")
        for name in ("patch_size", "merge_size", "temporal_patch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.family == "qwen2_vl" and not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"min_pixels {self.min_pixels} and max_pixels {self.max_pixels}: expected "
                "0 < min_pixels <= max_pixels"
            )
        if self.family == "fixed":
            if self.crop_height < self.patch_size or self.crop_width < self.patch_size:
                raise ValueError(
                    f"crop {self.crop_width}x{self.crop_height} is smaller than one "
                    f"{self.patch_size}-pixel patch"
                )
            if self.extra_tokens < -1:
                raise ValueError(f"extra_tokens must be >= -1, got {self.extra_tokens}")

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image the encoder sees, in pixels."""
        _check_size(width, height)
        if self.family == "fixed":
            return self.crop_width, self.crop_height
        h_bar, w_bar = _smart_resize(
            height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels
        )
        return w_bar, h_bar

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """(t, gh, gw): the encoder's patch grid (``image_grid_thw`` of Qwen2-VL)."""
        w, h = self.resized(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    def patches(self, width: int, height: int) -> int:
        """Encoder patches: ``t * gh * gw`` (the rows of Qwen2-VL's ``pixel_values``)."""
        t, gh, gw = self.grid(width, height)
        return t * gh * gw

    def tokens(self, width: int, height: int) -> int:
        """LM tokens the image becomes (copies of the image-pad token in the ids)."""
        if self.family == "fixed":
            return self.patches(width, height) + self.extra_tokens
        return self.patches(width, height) // (self.merge_size * self.merge_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (stored in the cost index's provenance)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageGeometry:
        return cls(**data)


def qwen2_vl(
    min_pixels: int = QWEN2_VL_MIN_PIXELS,
    max_pixels: int = QWEN2_VL_MAX_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> ImageGeometry:
    """Qwen2-VL's dynamic-resolution geometry (defaults: transformers' processor defaults)."""
    return ImageGeometry(
        family="qwen2_vl",
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )


def llava(crop: int = 336, patch_size: int = 14, extra_tokens: int = 0) -> ImageGeometry:
    """LLaVA-1.5's fixed tile: a CLIP-style ``crop x crop`` image (336, patch 14: 576 tokens)."""
    return ImageGeometry(
        family="fixed", patch_size=patch_size, crop_height=crop, crop_width=crop,
        extra_tokens=extra_tokens,
    )  # fmt: skip


def from_preprocessor_config(path: str | os.PathLike[str]) -> ImageGeometry:
    """The geometry a model's ``preprocessor_config.json`` describes (``path``: the file or the
    processor directory holding it).

    ``qwen2_vl``: ``min_pixels`` / ``max_pixels`` (or ``size.shortest_edge`` /
    ``size.longest_edge``; both forms present must agree, since transformers' slow and fast
    processors read different ones), ``patch_size``, ``merge_size``, ``temporal_patch_size``.
    ``fixed`` (CLIP): ``crop_size`` from this file, ``patch_size``,
    ``num_additional_image_tokens`` and ``vision_feature_select_strategy`` from
    ``processor_config.json`` beside it. Anything else is refused naming the file.
    """
    file = Path(path)
    if file.is_dir():
        file = file / PREPROCESSOR_CONFIG
    data = _read_json(file)
    kind = data.get("image_processor_type")
    try:
        if kind in _QWEN2_VL_PROCESSORS:
            return _qwen2_vl_from(file, data)
        if kind in _FIXED_PROCESSORS:
            return _fixed_from(file, data)
    except (TypeError, ValueError, KeyError) as exc:
        raise DatasetError(
            f"{file}: invalid {kind} settings ({exc}); fix the file or use the model's own"
        ) from exc
    raise DatasetError(
        f"{file}: image_processor_type {kind!r} is not supported; supported: "
        f"{', '.join(_QWEN2_VL_PROCESSORS + _FIXED_PROCESSORS)} (Qwen2-VL style dynamic "
        "resolution, or a fixed CLIP tile as LLaVA-1.5 uses)"
    )


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise DatasetError(
            f"{file}: not found; --processor takes a Hugging Face processor directory "
            f"(tokenizer files, {PREPROCESSOR_CONFIG})"
        ) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(
            f"{file}: unreadable JSON ({exc}); replace it with the model's own"
        ) from exc
    if not isinstance(data, dict):
        raise DatasetError(f"{file}: expected a JSON object, found {type(data).__name__}")
    return data


def _int(data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not an integer")
    return value


def _qwen2_vl_from(file: Path, data: dict[str, Any]) -> ImageGeometry:
    if data.get("do_resize", True) is not True:
        raise ValueError("do_resize false: images must then already be multiples of the patch")
    size = data.get("size") or {}
    if not isinstance(size, dict):
        raise ValueError(f"size is {size!r}, not an object")
    bounds = {}
    for key, edge, default in (
        ("min_pixels", "shortest_edge", QWEN2_VL_MIN_PIXELS),
        ("max_pixels", "longest_edge", QWEN2_VL_MAX_PIXELS),
    ):
        named = data.get(key)
        sized = size.get(edge)
        if named is not None and sized is not None and named != sized:
            raise ValueError(
                f"{key} {named} and size.{edge} {sized} disagree (transformers' slow and fast "
                "processors read different ones); make them equal"
            )
        pick = named if named is not None else sized
        bounds[key] = _int({key: pick}, key, default) if pick is not None else default
    return qwen2_vl(
        min_pixels=bounds["min_pixels"],
        max_pixels=bounds["max_pixels"],
        patch_size=_int(data, "patch_size", 14),
        merge_size=_int(data, "merge_size", 2),
        temporal_patch_size=_int(data, "temporal_patch_size", 2),
    )


def _fixed_from(file: Path, data: dict[str, Any]) -> ImageGeometry:
    crop = data.get("crop_size")
    if isinstance(crop, int) and not isinstance(crop, bool):
        crop = {"height": crop, "width": crop}
    if not isinstance(crop, dict) or data.get("do_center_crop", True) is not True:
        raise ValueError(f"a fixed tile needs do_center_crop and crop_size, got {crop!r}")
    proc_file = file.parent / PROCESSOR_CONFIG
    proc = _read_json(proc_file) if proc_file.is_file() else {}
    if "patch_size" not in proc:
        raise ValueError(
            f"the patch size is read from {proc_file} (LLaVA's processor_config.json), which "
            "has none"
        )
    patch = _int(proc, "patch_size", 14)
    extra = _int(proc, "num_additional_image_tokens", 0)
    if proc.get("vision_feature_select_strategy") == "default":
        extra -= 1
    return ImageGeometry(
        family="fixed",
        patch_size=patch,
        crop_height=_int(crop, "height", 0),
        crop_width=_int(crop, "width", 0),
        extra_tokens=extra,
    )


def _check_size(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise ImageSizeError(f"image size {width}x{height}: a side is zero")
    if max(width, height) / min(width, height) > MAX_ASPECT:
        raise ImageSizeError(
            f"image size {width}x{height}: aspect ratio {max(width, height) / min(width, height):.1f}"
            f" is above {MAX_ASPECT}, which the model's processor refuses; crop or pad the image"
        )


def _smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """transformers' ``smart_resize`` (Qwen2-VL), the same operations in the same order, so
    float rounding and Python's round-half-to-even give the same (height, width)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
