"""The batch of image-text records: the text collate's keys plus the model's own image keys.

:class:`ImageCollate` wraps a text collate (``PackCollate``: padded or packed, labels, audit
keys) and adds what the model family expects, computed in the DataLoader worker that collates
(``PackLoader`` collates in its workers): each stored image is decoded there
(:mod:`bcl_stream.vision.storage`) and run through the processor directory's own image
processor (``AutoProcessor.from_pretrained(DIR).image_processor``, loaded once per process),
so the keys are what ``processor(text=..., images=...)`` gives for the same records:

- ``pixel_values``: (sum of patches, C * temporal_patch * patch**2) for Qwen2-VL (the images in
  record order, as the processor concatenates a batch's images); (images, 3, H, W) for a fixed
  tile (LLaVA);
- ``image_grid_thw``: (images, 3) for Qwen2-VL;
- ``image_counts``: (B,) images per record (the audit of where the rows come from).

Checks, each a :class:`~bcl_stream.errors.DatasetError` naming the record: a decoded image's
size equals the size stored at preprocessing, and the image tokens the processor's geometry
gives equal the image tokens in the record's stored ids (a processor with other pixel bounds
than the one the data was written with is refused, not trained on silently wrong data).

Packed layout, Qwen2-VL: the model's 3-D rotary positions (``position_ids`` (3, 1, N)) are
computed per record with the model's own ``get_rope_index`` and concatenated, so every record
starts at position 0 as it does alone; attention stays inside each record through the text
collate's ``cu_seqlens`` (see ``lightning_module/hf_causal_lm.py``).
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from PIL import Image

from bcl_stream.errors import DatasetError
from bcl_stream.records.image_text import record_images
from bcl_stream.vision.geometry import ImageGeometry, from_preprocessor_config


@functools.cache
def _processor(directory: str) -> Any:
    """The directory's processor (once per process: each DataLoader worker loads its own)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(directory, local_files_only=True)


@functools.cache
def _geometry(directory: str) -> ImageGeometry:
    return from_preprocessor_config(directory)


def decode(data: bytes, where: str) -> Image.Image:
    """An RGB image from its stored file bytes (the pixels are read here, in the worker)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
        return image.convert("RGB")
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ... on bad data
        raise DatasetError(
            f"{where}: the stored image cannot be decoded ({type(exc).__name__}: {exc}); its "
            "data past the header is damaged: re-encode it and re-run preprocess"
        ) from exc


@dataclass(frozen=True, slots=True)
class ImageCollate:
    """``base(pack)`` plus the model's image keys (see the module docstring). Frozen, module
    level: picklable into DataLoader workers."""

    base: Callable[[Any], dict[str, Any]]
    """The text collate (``PackCollate``: a pack of records in, a batch out)."""
    processor: str
    """The Hugging Face processor directory the data was preprocessed with."""

    def __call__(self, pack: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = self.base(pack)
        proc = _processor(self.processor)
        geometry = _geometry(self.processor)
        image_id = int(proc.tokenizer.convert_tokens_to_ids(proc.image_token))
        images: list[Image.Image] = []
        counts = []
        for record in pack:
            where = f"record {record.get('sample_id')}"
            stored = record_images(dict(record), where)
            want = sum(geometry.tokens(w, h) for _, w, h in stored)
            have = int((np.asarray(record["input_ids"]) == image_id).sum())
            if want != have:
                raise DatasetError(
                    f"{where}: its stored ids hold {have} image tokens but processor "
                    f"{self.processor} makes {want} of its images; read the data with the "
                    "processor it was preprocessed with"
                )
            for k, (data, w, h) in enumerate(stored):
                image = decode(data, f"{where} image {k}")
                if image.size != (w, h):
                    raise DatasetError(
                        f"{where} image {k}: decodes to {image.size[0]}x{image.size[1]} but "
                        f"was stored as {w}x{h}; the shard is damaged: re-run preprocess"
                    )
                images.append(image)
            counts.append(len(stored))
        batch["image_counts"] = torch.tensor(counts, dtype=torch.long)
        if images:
            hint = {} if getattr(proc.image_processor, "is_fast", False) else {
                "input_data_format": "channels_last"  # a 1-3 px side is no channel axis
            }  # fmt: skip
            out = proc.image_processor(images=images, return_tensors="pt", **hint)
            for key in ("pixel_values", "image_grid_thw"):
                if key in out:
                    batch[key] = out[key]
        if geometry.family == "qwen2_vl" and "cu_seqlens" in batch:
            batch["position_ids"] = rope_positions(
                batch["input_ids"][0],
                batch["cu_seqlens"],
                batch.get("image_grid_thw"),
                counts,
                proc,
            )
        return batch


def rope_positions(
    ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    grids: torch.Tensor | None,
    counts: Sequence[int],
    proc: Any,
) -> torch.Tensor:
    """(3, 1, N) Qwen2-VL rotary positions of a packed row: each record's from the model's own
    ``get_rope_index`` on that record alone (its images' grids), concatenated."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    tok = proc.tokenizer
    config = SimpleNamespace(
        vision_config=SimpleNamespace(spatial_merge_size=proc.image_processor.merge_size),
        image_token_id=tok.convert_tokens_to_ids(proc.image_token),
        video_token_id=tok.convert_tokens_to_ids(proc.video_token),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
    )
    owner = SimpleNamespace(config=config)
    parts = []
    image = 0
    bounds = cu_seqlens.tolist()
    for a, b, n in zip(bounds[:-1], bounds[1:], counts, strict=True):
        record = ids[a:b][None, :]
        grid = None if grids is None or n == 0 else grids[image : image + n]
        image += n
        positions, _ = Qwen2VLModel.get_rope_index(owner, record, grid, None, None)  # type: ignore[arg-type]
        parts.append(positions)
    return torch.cat(parts, dim=2)
