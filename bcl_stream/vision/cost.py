"""The two-term cost of an image-text record: the vision encoder's and the language model's.

Why two terms: a vision-language model runs two networks on a record. The vision encoder sees
each image as P patches and costs ``a*P + b*P^2 + k`` per image: every matmul is linear in the
patches, and its attention is full (non-causal) *within* each image, so it is quadratic in each
image's own patch count, never in the record's total. The language model sees the text tokens
plus the image tokens the encoder's merger emits (P / merge_size^2 per image) and costs
c(L) = a*L + b*L^2 + k (:class:`bcl_stream.cost.CostModel`) on that L. The two are summed for
the planner (one number per record), but kept apart for the per-term balance report: a pack
balanced in sum can still leave the encoder unbalanced when it runs as its own stage.

The index stores the components (text tokens, image tokens, patches per image), never only
their sum, so a :class:`TwoTermCost` re-costs a dataset without rewriting its shards.

Presets (:data:`VISION_SHAPES`) are derived from the models' public configs as the language
presets are (6 training FLOPs per matmul parameter and token: 2 forward, 4 backward). For the
Qwen2-VL vision tower (``vision_config`` of Qwen/Qwen2-VL-2B-Instruct and -7B-Instruct:
depth 32, embed_dim 1280, mlp_ratio 4, num_heads 16, in_chans 3, patch_size 14,
temporal_patch_size 2, spatial_merge_size 2, hidden_size = the LM's width), per patch:

- patch embedding: a Conv3d of 3*2*14*14 = 1176 inputs to 1280: 1,505,280 parameters;
- 32 blocks of qkv (1280 x 3840), proj (1280 x 1280) and an MLP 1280 -> 5120 -> 1280:
  19,660,800 each, 629,145,600 in all;
- the merger, run once per 2x2 patches: 5120 x 5120 and 5120 x hidden_size, a quarter of it
  per patch: 8,519,680 (2B, hidden 1536) or 11,141,120 (7B, hidden 3584).

So a = 6 x 639,170,560 (2B) or 6 x 641,792,000 (7B) FLOPs per patch. Attention per image:
QK^T and AV each cost 2*d*P^2 FLOPs per layer forward with full attention, x3 for forward and
backward: b = 12 * depth * embed_dim = 491,520 FLOPs per patch^2. k = 0 (only a measured fit
sees a per-image overhead). A frozen encoder (no backward) costs a third of it:
:func:`vision_from_shape` with ``trained=False``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import (
    FLOPS_PER_PARAM_PER_TOKEN,
    SHAPES,
    Coefficients,
    CostModel,
    ModelShape,
    from_shape,
    held_out_fit,
    quadratic_cost,
)
from bcl_stream.vision.components import RecordComponents

FORWARD_FLOPS_PER_PARAM = 2.0
"""A frozen encoder runs forward only: 2 FLOPs per parameter and patch."""


def per_record_sum(
    components: RecordComponents, per_image: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """Sum of a per-image quantity over each record's images (0 for a record without one)."""
    values = np.asarray(per_image, dtype=np.float64)
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    offsets = components.image_offsets
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionCost(Coefficients):
    """The vision encoder's cost of one image of P patches: a*P + b*P^2 + k (``a``: the
    encoder's matmuls and the merger's share per patch; ``b``: full attention within the image
    per patch^2; ``k``: per image, a constant overhead only a measured fit sees)."""

    def image_costs(self, patches: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Cost of each image from its patch count."""
        return quadratic_cost(self.a, self.b, self.k, patches)

    def record_costs(self, components: RecordComponents) -> npt.NDArray[np.float64]:
        """Vision cost per record: the sum over its images (0 for a text-only record)."""
        return per_record_sum(components, self.image_costs(components.image_patches))


@dataclass(frozen=True, slots=True, kw_only=True)
class TwoTermCost:
    """Vision encoder plus language model, in one unit: a record's cost is the sum of its
    images' :class:`VisionCost` and the language model's c(text + image tokens)."""

    name: str
    vision: VisionCost
    language: CostModel

    def __post_init__(self) -> None:
        if self.vision.unit != self.language.unit:
            raise ValueError(
                f"the vision term is in {self.vision.unit!r} and the language term in "
                f"{self.language.unit!r}: both terms must be in one unit to be summed"
            )

    def terms(
        self, components: RecordComponents
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(vision, language) cost per record; the language model's L is text plus image tokens
        (``RecordComponents.tokens``, what the cost index stores and a token budget counts)."""
        return self.vision.record_costs(components), self.language.cost(components.tokens)

    def cost(self, components: RecordComponents) -> npt.NDArray[np.float64]:
        """The summed cost per record: what the planner balances."""
        vision, language = self.terms(components)
        return vision + language

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vision": self.vision.to_dict(),
            "language": self.language.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TwoTermCost:
        """Inverse of :meth:`to_dict`."""
        unknown = set(data) - {"name", "vision", "language"}
        if unknown or "vision" not in data or "language" not in data:
            raise ValueError(
                f"two-term cost model needs keys 'name', 'vision', 'language'; got {sorted(data)}"
            )
        return cls(
            name=str(data.get("name", "two-term")),
            vision=VisionCost(**data["vision"]),
            language=CostModel.from_dict(data["language"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionShape:
    """A ViT vision tower as its public ``vision_config`` gives it (Qwen2-VL naming)."""

    depth: int
    embed_dim: int
    mlp_ratio: float
    in_chans: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden: int
    """The merger's output width: the language model's ``hidden_size``."""

    def params_per_patch(self) -> float:
        """Matmul parameters each patch passes through (the merger's per 2x2 group shared)."""
        d = self.embed_dim
        embed = self.in_chans * self.temporal_patch_size * self.patch_size**2 * d
        mlp_hidden = int(d * self.mlp_ratio)
        block = 3 * d * d + d * d + 2 * d * mlp_hidden
        group = self.spatial_merge_size**2
        merged = d * group
        merger = (merged * merged + merged * self.out_hidden) / group
        return float(embed + self.depth * block + merger)


def vision_from_shape(
    name: str, shape: VisionShape, source: str, *, trained: bool = True
) -> VisionCost:
    """Training-FLOPs vision cost of a tower (the module docstring's derivation);
    ``trained=False``: a frozen encoder, forward only."""
    per_param = FLOPS_PER_PARAM_PER_TOKEN if trained else FORWARD_FLOPS_PER_PARAM
    attention = (12.0 if trained else 4.0) * shape.depth * shape.embed_dim
    return VisionCost(
        name=name, a=per_param * shape.params_per_patch(), b=attention, unit="flops", source=source
    )


def qwen2_vl_tower(out_hidden: int) -> VisionShape:
    """Qwen2-VL's vision tower (``vision_config`` of the 2B and 7B models, the same tower)
    feeding a language model of width ``out_hidden``."""
    return VisionShape(
        depth=32,
        embed_dim=1280,
        mlp_ratio=4.0,
        in_chans=3,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden=out_hidden,
    )


VISION_SHAPES: dict[str, tuple[VisionShape, ModelShape, str]] = {
    "qwen2-vl-2b": (
        qwen2_vl_tower(1536),
        ModelShape(
            n_layers=28, d_model=1536, n_heads=12, n_kv_heads=2, ffn_hidden=8960, vocab_size=151936
        ),
        "Qwen/Qwen2-VL-2B-Instruct config.json (vision_config and text fields)",
    ),
    "qwen2-vl-7b": (
        qwen2_vl_tower(3584),
        SHAPES["qwen2.5-7b"][0],  # the same text shape: 28 x 3584, 28/4 heads, 18944, 152064
        "Qwen/Qwen2-VL-7B-Instruct config.json (vision_config and text fields)",
    ),
}


def two_term_preset_names() -> list[str]:
    """Every name :func:`get_two_term_preset` accepts."""
    return list(VISION_SHAPES)


def get_two_term_preset(name: str, *, trained_vision: bool = True) -> TwoTermCost:
    """A two-term preset: a vision-language model's tower and language model from its config."""
    if name not in VISION_SHAPES:
        raise ValueError(
            f"unknown two-term cost model {name!r}; choose one of {two_term_preset_names()}"
        )
    tower, text, source = VISION_SHAPES[name]
    vision = vision_from_shape(name, tower, source, trained=trained_vision)
    return TwoTermCost(name=name, vision=vision, language=from_shape(name, text, source))


@dataclass(frozen=True, slots=True)
class TwoTermFit:
    """A least-squares fit of measured pack times to both terms, and its held-out score."""

    model: TwoTermCost
    r2_train: float
    r2_holdout: float
    mean_rel_error_holdout: float


TWO_TERM_FEATURES = ("tokens", "tokens_sq", "records", "patches", "patches_sq", "images")
"""The columns a pack's time is regressed on: per-record c(L) summed over the pack (L, L^2,
1) and the per-image vision cost summed over its images (P, P^2, 1)."""


def pack_two_term_features(packs: Sequence[RecordComponents]) -> npt.NDArray[np.float64]:
    """(n_packs, 6): :data:`TWO_TERM_FEATURES` of each pack (a pack given as the components
    of its records)."""
    rows = []
    for pack in packs:
        tokens = pack.tokens.astype(np.float64)
        patches = np.asarray(pack.image_patches, dtype=np.float64)
        rows.append(
            (
                tokens.sum(),
                (tokens * tokens).sum(),
                float(tokens.size),
                patches.sum(),
                (patches * patches).sum(),
                float(patches.size),
            )
        )
    return np.array(rows, dtype=np.float64).reshape(-1, len(TWO_TERM_FEATURES))


def fit_two_term_cost(
    packs: Sequence[RecordComponents],
    seconds: npt.ArrayLike,
    *,
    name: str = "fitted",
    holdout_fraction: float = 0.25,
    seed: int = 0,
) -> TwoTermFit:
    """Fit both terms from measured pack times (non-negative least squares on
    :data:`TWO_TERM_FEATURES`; ``bcl_stream.cost.fit_cost_model`` with the vision term's three
    regressors added). A random ``holdout_fraction`` of packs is scored, not fitted. Packs
    without images leave the vision columns 0: design packs with images of varied sizes (one
    large image against many small ones of the same total) to separate P from P^2."""
    fit = held_out_fit(
        pack_two_term_features(packs),
        seconds,
        least=12,
        what=" two terms",
        holdout_fraction=holdout_fraction,
        seed=seed,
    )
    language = fit.coef[:3].copy()
    if not language.any():
        language[0] = 1e-30  # CostModel refuses all-zero terms
    model = TwoTermCost(
        name=name,
        vision=VisionCost.fitted(name, fit.coef[3:], fit.source),
        language=CostModel.fitted(name, language, fit.source),
    )
    return TwoTermFit(model, fit.r2_train, fit.r2_holdout, fit.mean_rel_error_holdout)


def resolve_two_term(spec: str | None) -> TwoTermCost | None:
    """A two-term preset name (:func:`two_term_preset_names`) or a JSON file holding a
    :meth:`TwoTermCost.to_dict` (a ``vision`` key) as a :class:`TwoTermCost`; None for anything
    else (a single-term preset or file: ``bcl_stream.cost.resolve`` reads those)."""
    if spec is None:
        return None
    if spec in VISION_SHAPES:
        return get_two_term_preset(spec)
    if not spec.endswith(".json"):
        return None
    try:
        data = json.loads(Path(spec).read_text())
    except (OSError, json.JSONDecodeError):
        return None  # bcl_stream.cost.resolve reports an unreadable file
    if not isinstance(data, dict) or "vision" not in data:
        return None
    try:
        return TwoTermCost.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"two-term cost model {spec}: {exc}") from exc
