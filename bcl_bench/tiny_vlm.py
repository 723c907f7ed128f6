"""A tiny random-initialised Qwen2-VL built from a config (no download): the model
``bcl-stream calibrate`` times on image packs when no ``--model`` is given.

Why a real family and not a proxy: the two-term cost says the vision tower is linear in each
image's patches plus attention quadratic in each image's own patches, and the language model is
c(L) on text plus image tokens. Timing Hugging Face's own ``Qwen2VLForConditionalGeneration``
(its patch embedding, vision blocks that attend within each image, the 2x2 merger, the image
tokens scattered into the text) tests that shape on the code that runs in training; a proxy
would only reproduce the formula it was written from. Its width is small so a CPU calibration
takes a minute; fit with your own model (``--model pkg.module:factory``) for real coefficients.

It takes the batch ``ImageCollate`` gives for the packed layout (``input_ids`` (1, N),
``labels``, ``cu_seqlens``, ``pixel_values``, ``image_grid_thw``, ``image_counts``) and runs
each record alone: CPU has no varlen attention kernel, and a dense block-diagonal mask would do
the masked-out work the cost model (per-record attention, as flash-attention varlen computes
it) does not count. Importing this module imports torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import Qwen2VLConfig

VOCAB = 1024
"""Token ids below :data:`IMAGE_TOKEN_ID` are text; the four special ids follow it."""
IMAGE_TOKEN_ID = 1000
VIDEO_TOKEN_ID = 1001
VISION_START_ID = 1002
VISION_END_ID = 1003


def qwen2_vl_config(
    *, vocab_size: int, width: int, vision_depth: int, vision_width: int, **extra: Any
) -> Qwen2VLConfig:
    """A small ``Qwen2VLConfig`` with the real model's patch arithmetic (patch 14, temporal
    patch 2, 2 x 2 merge, 3 channels) and its split of the rotary half-head into temporal,
    height and width sections (1/4, 3/8, 3/8: 16/24/24 of its 64): 2 language layers of
    ``width`` (4 query heads, 2 key/value heads, MLP 2 x ``width``) and ``vision_depth``
    vision blocks of ``vision_width`` (heads of 16, MLP ratio 2) merged into ``width``.
    ``extra`` goes to the config: the special token ids, the attention implementation."""
    from transformers import Qwen2VLConfig

    half = width // 4 // 2  # the rotary half of one of the 4 heads
    return Qwen2VLConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"type": "mrope", "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]},
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_width,
            "hidden_size": width,
            "num_heads": vision_width // 16,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        **extra,
    )


class TinyQwen2VL(torch.nn.Module):
    """Qwen2-VL with 2 language layers of width 128 and 2 vision blocks of width 64 (patch 14,
    temporal patch 2, merge 2: the real model's patch arithmetic, 1176 values per patch)."""

    image_token_id = IMAGE_TOKEN_ID
    vision_start_id = VISION_START_ID
    vision_end_id = VISION_END_ID

    def __init__(self) -> None:
        super().__init__()
        from transformers import Qwen2VLForConditionalGeneration

        config = qwen2_vl_config(
            vocab_size=VOCAB,
            width=128,
            vision_depth=2,
            vision_width=64,
            image_token_id=IMAGE_TOKEN_ID,
            video_token_id=VIDEO_TOKEN_ID,
            vision_start_token_id=VISION_START_ID,
            vision_end_token_id=VISION_END_ID,
            attn_implementation="sdpa",
        )
        self.model = Qwen2VLForConditionalGeneration(config)
        self.config = config

    def loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """Summed loss of the pack's records, each run alone with its own images."""
        cu = batch["cu_seqlens"].tolist()
        counts = batch["image_counts"].tolist()
        grids = batch["image_grid_thw"]
        patches = grids.prod(dim=1).tolist() if grids.numel() else []
        total = torch.zeros(())
        image = pixel = 0
        for r in range(len(cu) - 1):
            ids = batch["input_ids"][:, cu[r] : cu[r + 1]]
            labels = batch["labels"][:, cu[r] : cu[r + 1]]
            n = int(counts[r])
            kwargs: dict[str, Any] = {}
            if n:
                rows = sum(patches[image : image + n])
                kwargs["pixel_values"] = batch["pixel_values"][pixel : pixel + rows]
                kwargs["image_grid_thw"] = grids[image : image + n]
                image, pixel = image + n, pixel + rows
            total = total + self.model(input_ids=ids, labels=labels, **kwargs).loss
        return total
