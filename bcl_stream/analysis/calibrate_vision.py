"""Calibrate both terms of the two-term cost by timing a vision-language model on image packs.

Why: the text calibration (``analysis/calibrate.py``) fits c(L) from packs of token ids. A record
with images also costs the vision encoder, a*P + b*P^2 + k per image of P patches
(``vision/cost.py``), and the language model's L counts its image tokens (P / merge^2 each), so
the two terms' columns move together unless the packs are designed to separate them. Each pack
here pairs a text composition (``calibrate.design_packs``: equal, one long, mixed, or a
dataset's records) with an image composition chosen independently of it: no images (anchors
the language terms), one large image in one record (large sum P^2 for its P), one small image
per record (many images: the per-image constant), mixed (0 to ``max_images`` images of random
sizes per record) and, with a dataset, its own records' images. The pack times are then fitted
by ``vision.cost.fit_two_term_cost`` (six non-negative columns, a quarter of the packs held
out and scored), as ``calibrate`` fits text.

Images are given as patch grids (1, gh, gw) with both sides multiples of the merge size, the
shapes a Qwen2-VL processor emits; a dataset's patch counts (``bcl_components.npz``) are
factored back into such grids (the cost depends on P only). A pack's batch is what
``ImageCollate`` gives for the packed layout: ``input_ids`` with each image as
``<vision_start> <image_pad> x P/merge^2 <vision_end>`` before random text ids (the stored text
tokens count the two markers), ``pixel_values`` (random, one row per patch), ``image_grid_thw``
and ``image_counts``. torch is imported inside functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.calibrate import (
    CalibrationConfig,
    design_packs,
    fit_report,
    load_factory,
    make_step,
    scaled_r2_of,
    time_configured,
)
from bcl_stream.vision.components import RecordComponents
from bcl_stream.vision.cost import TwoTermFit, fit_two_term_cost, get_two_term_preset

IMAGE_KINDS = ("none", "one_large", "small_each", "mixed", "sampled")


@dataclass(frozen=True, slots=True, kw_only=True)
class ImagePackConfig:
    """How the images of the calibration packs are drawn."""

    merge_size: int | None = None
    """Grid sides are multiples of it (Qwen2-VL's ``merge_size``); image tokens = P / merge^2.
    None: the timed model's (``calibrate_images``)."""
    max_side: int = 32
    """Largest grid side in patches (32: 1,024 patches, a 448 x 448 image at patch 14)."""
    max_images: int = 2
    """Most images of one record in the ``mixed`` composition."""
    pack_patches: int = 4096
    """Most patches in one pack: bounds the slowest pack's time."""

    def __post_init__(self) -> None:
        m = 1 if self.merge_size is None else self.merge_size
        if m < 1 or self.max_side < m or self.max_images < 1:
            raise ValueError(
                f"need merge_size >= 1, max_side >= merge_size and max_images >= 1, got {self}"
            )
        if self.pack_patches < m * m:
            raise ValueError(f"pack_patches {self.pack_patches} holds no image")

    @property
    def merge(self) -> int:
        if self.merge_size is None:
            raise ValueError("ImagePackConfig.merge_size is not set (the model's is taken)")
        return self.merge_size


@dataclass(frozen=True, slots=True)
class ImagePack:
    """One designed pack: each record's text tokens (the two markers of each image included)
    and its images' patch grids (gh, gw)."""

    text: tuple[int, ...]
    grids: tuple[tuple[tuple[int, int], ...], ...]

    def components(self, merge_size: int) -> RecordComponents:
        """The pack as the cost components its records would store."""
        group = merge_size * merge_size
        return RecordComponents.build(
            (t, sum(h * w // group for h, w in g), [h * w for h, w in g])
            for t, g in zip(self.text, self.grids, strict=True)
        )


def grid_of(patches: int, merge_size: int, max_side: int) -> tuple[int, int]:
    """A (gh, gw) grid of ``patches`` patches with both sides multiples of ``merge_size`` (the
    most square such factoring), scaled down to sides of at most ``max_side`` when larger."""
    m = merge_size
    units = max(1, patches // (m * m))
    low = max(d for d in range(1, int(units**0.5) + 1) if units % d == 0)
    gh, gw = low * m, units // low * m
    if gw > max_side:  # keep the aspect, fit the largest side
        scale = max_side / gw
        gh, gw = max(m, int(gh * scale) // m * m), max_side // m * m
    return gh, gw


def _side(rng: np.random.Generator, low: int, high: int, m: int) -> int:
    """A grid side, log-uniform in [low, high], a multiple of ``m``."""
    value = float(np.exp(rng.uniform(np.log(low), np.log(max(high, low)))))
    return max(m, round(value / m) * m)


def _images(
    kind: str,
    b: int,
    rng: np.random.Generator,
    cfg: ImagePackConfig,
    sampled: list[tuple[int, ...]] | None,
) -> list[list[tuple[int, int]]]:
    """Each record's grids under one image composition (``sampled``: the dataset's records'
    patch counts)."""
    m, top = cfg.merge, cfg.max_side
    if kind == "none":
        return [[] for _ in range(b)]
    if kind == "one_large":
        side = lambda: _side(rng, top // 2, top, m)  # noqa: E731
        return [[(side(), side())], *([] for _ in range(b - 1))]
    if kind == "small_each":
        side = lambda: _side(rng, m, max(m, top // 4), m)  # noqa: E731
        return [[(side(), side())] for _ in range(b)]
    if kind == "mixed":
        return [
            [(_side(rng, m, top, m), _side(rng, m, top, m)) for _ in range(n)]
            for n in rng.integers(0, cfg.max_images + 1, b)
        ]
    assert sampled is not None
    return [[grid_of(p, m, top) for p in sampled[i]] for i in range(b)]


def _fit_patches(grids: list[list[tuple[int, int]]], cfg: ImagePackConfig) -> None:
    """Halve the largest image's sides until the pack holds at most ``pack_patches``."""
    m = cfg.merge
    while sum(h * w for g in grids for h, w in g) > cfg.pack_patches:
        r, i = max(
            ((r, i) for r, g in enumerate(grids) for i in range(len(g))),
            key=lambda ri: grids[ri[0]][ri[1]][0] * grids[ri[0]][ri[1]][1],
        )
        h, w = grids[r][i]
        if h * w <= m * m:
            grids[r].pop(i)  # a pack of minimal images still too large: drop one
        else:
            grids[r][i] = (max(m, h // 2 // m * m), max(m, w // 2 // m * m))


def design_image_packs(
    config: CalibrationConfig,
    images: ImagePackConfig,
    components: RecordComponents | None = None,
) -> list[ImagePack]:
    """``config.n_packs`` packs of ``config.pack_size`` records: text lengths from
    :func:`~bcl_stream.analysis.calibrate.design_packs` (``sampled`` from ``components``'
    text tokens when given), images from the compositions of :data:`IMAGE_KINDS` (``sampled``
    only with ``components``), cycled on a period prime to the text's so the two vary apart."""
    rng = np.random.default_rng(config.seed + 7)
    lengths = None if components is None else components.text_tokens
    texts = design_packs(config, lengths)
    kinds = IMAGE_KINDS if components is not None and components.n_images else IMAGE_KINDS[:4]
    if math.gcd(len(kinds), 3 if lengths is None else 4) != 1:
        kinds = (*kinds, "mixed")  # a period prime to design_packs' (3 kinds, 4 with lengths)
    b = config.pack_size
    packs = []
    for i, text in enumerate(texts):
        kind = kinds[i % len(kinds)]
        sampled = None
        if kind == "sampled":
            assert components is not None
            rows = rng.integers(0, len(components), b)
            sampled = [tuple(int(p) for p in components.patches_of(int(r))) for r in rows]
        grids = _images(kind, b, rng, images, sampled)
        _fit_patches(grids, images)
        # every image needs its two markers among the record's text tokens, and one text token
        floor = [2 * len(g) + 1 for g in grids]
        packs.append(
            ImagePack(
                tuple(max(int(t), f) for t, f in zip(text, floor, strict=True)),
                tuple(tuple(g) for g in grids),
            )
        )
    return packs


def image_pack_batch(
    pack: ImagePack,
    *,
    image_token_id: int,
    vision_start_id: int,
    vision_end_id: int,
    patch_dim: int,
    merge_size: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The packed batch of one pack (the module docstring): text ids drawn below
    ``image_token_id`` (Qwen2-VL's special ids follow its text vocabulary)."""
    import torch

    from bcl_stream.loading.collate import collate_packed

    group = merge_size * merge_size
    records = []
    for j, (text, grids) in enumerate(zip(pack.text, pack.grids, strict=True)):
        ids: list[int] = []
        for h, w in grids:
            ids += [vision_start_id, *[image_token_id] * (h * w // group), vision_end_id]
        plain = text - 2 * len(grids)
        ids += rng.integers(0, image_token_id, plain).tolist()
        records.append({"input_ids": np.asarray(ids, dtype=np.uint32), "sample_id": j})
    batch = collate_packed(records, labels="unshifted")
    every = [g for record in pack.grids for g in record]
    batch["image_grid_thw"] = torch.tensor(
        [[1, h, w] for h, w in every] or np.zeros((0, 3)), dtype=torch.long
    )
    batch["image_counts"] = torch.tensor([len(g) for g in pack.grids], dtype=torch.long)
    patches = sum(h * w for h, w in every)
    batch["pixel_values"] = torch.from_numpy(
        rng.standard_normal((patches, patch_dim)).astype(np.float32)
    )
    return batch


def vision_dims(model: Any) -> dict[str, int]:
    """The ids and sizes a batch for ``model`` needs, from its attributes or its Hugging Face
    config (``image_token_id``, ``vision_start_token_id``, ``vision_end_token_id``, the vision
    config's patch sizes)."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)

    def get(name: str, *alternatives: Any) -> int:
        for owner, key in ((model, name), *alternatives):
            value = getattr(owner, key, None)
            if value is not None:
                return int(value)
        raise ValueError(
            f"calibrating image packs needs the model's {name} (an attribute, or its Hugging "
            "Face config's); give a Qwen2-VL style model"
        )

    patch = get("patch_size", (vision, "patch_size"))
    return {
        "image_token_id": get("image_token_id", (config, "image_token_id")),
        "vision_start_id": get("vision_start_id", (config, "vision_start_token_id")),
        "vision_end_id": get("vision_end_id", (config, "vision_end_token_id")),
        "merge_size": get("merge_size", (vision, "spatial_merge_size")),
        "patch_dim": get("in_channels", (vision, "in_channels"))
        * get("temporal_patch_size", (vision, "temporal_patch_size"))
        * patch
        * patch,
    }


@dataclass(frozen=True, slots=True)
class ImageCalibration:
    """The two-term fit, the evidence behind it, and how other models' shapes explain it."""

    fit: TwoTermFit
    packs: list[ImagePack]
    components: list[RecordComponents]
    times: npt.NDArray[np.float64]
    """(n_packs, repeats) seconds."""
    preset_r2: dict[str, float]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> npt.NDArray[np.float64]:
        return np.median(self.times, axis=1)

    def report(self) -> dict[str, Any]:
        """JSON-friendly, with ``calibrate``'s keys: fit quality, timing noise, the shapes'
        scaled R^2, every pack's components and timings."""
        return {
            **fit_report(self.fit, self.preset_r2, self.times, self.settings),
            "packs": [
                {
                    "text_tokens": c.text_tokens.tolist(),
                    "image_tokens": c.image_tokens.tolist(),
                    "patches": [c.patches_of(r).tolist() for r in range(len(c))],
                    "seconds": s.tolist(),
                }
                for c, s in zip(self.components, self.times, strict=True)
            ],
        }


def shape_r2(packs: Sequence[RecordComponents], seconds: npt.ArrayLike) -> dict[str, float]:
    """Scaled R^2 of cost shapes on the packs: ``tokens`` (L with image tokens expanded,
    blind to the encoder), and the ``qwen2-vl-2b`` preset's two terms summed."""
    preset = get_two_term_preset("qwen2-vl-2b")
    return {
        "tokens": scaled_r2_of([float(c.tokens.sum()) for c in packs], seconds),
        "qwen2-vl-2b": scaled_r2_of([float(preset.cost(c).sum()) for c in packs], seconds),
    }


def calibrate_images(
    model: str | Any,
    config: CalibrationConfig | None = None,
    images: ImagePackConfig | None = None,
    *,
    components: RecordComponents | None = None,
    name: str = "calibrated",
    progress: bool = True,
) -> ImageCalibration:
    """Build the model (``'pkg.module:factory'`` or a factory; it takes the packed image batch,
    e.g. ``bcl_bench.tiny_vlm:TinyQwen2VL``), time the designed image packs (``components``: a
    dataset's, for the ``sampled`` compositions), fit both terms in seconds."""
    import torch

    cfg = config or CalibrationConfig()
    if cfg.layout != "packed":
        raise ValueError("image packs are timed in the packed layout (what ImageCollate gives)")
    factory = load_factory(model) if isinstance(model, str) else model
    label = model if isinstance(model, str) else getattr(model, "__qualname__", repr(model))
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        torch.manual_seed(cfg.seed)
        built = factory()
        dims = vision_dims(built)
        merge = dims["merge_size"]
        shape = images or ImagePackConfig()
        if shape.merge_size is None:
            shape = replace(shape, merge_size=merge)
        elif shape.merge_size != merge:
            raise ValueError(
                f"the model merges {merge} x {merge} patches, the packs assume {shape.merge_size}"
            )
        packs = design_image_packs(cfg, shape, components)
        rng = np.random.default_rng(cfg.seed + 1)
        batches = [image_pack_batch(p, rng=rng, **dims) for p in packs]
        times = time_configured(cfg, make_step(built), batches, progress)
    finally:
        torch.set_num_threads(previous)
    comps = [p.components(merge) for p in packs]
    seconds = np.median(times, axis=1)
    fit = fit_two_term_cost(
        comps, seconds, name=name, holdout_fraction=cfg.holdout_fraction, seed=cfg.seed
    )
    settings = {
        "model": label,
        **asdict(cfg),
        **{f"images_{k}": v for k, v in asdict(shape).items()},
        "torch": torch.__version__,
    }
    return ImageCalibration(fit, packs, comps, times, shape_r2(comps, seconds), settings)
