"""Image-text records -> the exact ids the model's processor gives, its loss mask and its
cost components.

Why this way: ``processor(text=rendered, images=...)`` (Qwen2-VL's and LLaVA's processors)
renders nothing itself: it replaces each image token in the chat template's rendering with
``tokens(w, h)`` copies and tokenizes. The image token is a special token, so tokenizing the
rendering and repeating each image token's id ``tokens(w, h)`` times gives the same ids without
decoding an image: the count comes from the header (:mod:`bcl_stream.vision.geometry`). The
rendering and the assistant masks are the text path's own
(:class:`~bcl_stream.text.templates.Encoder`, with the processor directory as the tokenizer),
so loss masking is the one the text records get; the spans are shifted past each expansion.
The tests compare the ids with the real processor call on synthetic pixels of the same sizes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError
from bcl_stream.text.chat import Conversation
from bcl_stream.text.templates import Encoded, Encoder, TemplateError
from bcl_stream.vision.fingerprint import FINGERPRINT_KEY, processor_fingerprint
from bcl_stream.vision.geometry import (
    PREPROCESSOR_CONFIG,
    ImageGeometry,
    ImageSizeError,
    from_preprocessor_config,
)
from bcl_stream.vision.image_header import ImageError, image_size

PROCESSOR_CONFIG = "processor_config.json"


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """A record's conversation (image parts ``{"type": "image"}``) and its images' bytes (the
    shape of the image-text record kind, ``bcl_stream/records/image_text.py``)."""

    conversation: Conversation
    images: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ImageEncoded(Encoded):
    """One image-text record's ids (image tokens expanded) and mask, as every record kind's
    :class:`Encoded`, plus its images and cost components."""

    images: tuple[bytes, ...] = ()
    """Each image's file bytes (stored in the shards for the reader to decode)."""
    sizes: tuple[tuple[int, int], ...] = ()
    """(width, height) of each image, from its header."""
    image_tokens: int = 0
    patches: tuple[int, ...] = ()
    """Encoder patches of each image."""

    @property
    def encoded(self) -> Encoded:
        """The ids and mask alone."""
        return Encoded(self.ids, self.spans)

    @property
    def text_tokens(self) -> int:
        return int(self.ids.size) - self.image_tokens


class ImageTextEncoder:
    """Encodes :class:`ImageRecord` s under one processor directory
    (a Hugging Face processor saved with ``save_pretrained``: tokenizer files, chat template,
    ``preprocessor_config.json``). Built once per worker process."""

    def __init__(
        self, processor: str, loss_on: str = "assistant", *, max_image_pixels: int | None = None
    ) -> None:
        root = Path(processor)
        if not (root / PREPROCESSOR_CONFIG).is_file():
            raise DatasetError(
                f"--processor {processor}: no {PREPROCESSOR_CONFIG}; give the directory a "
                "Hugging Face processor was saved to (save_pretrained), with its tokenizer"
            )
        self.processor_dir = str(root.resolve())
        self.geometry: ImageGeometry = from_preprocessor_config(root)
        self.text = Encoder(self.processor_dir, loss_on)
        self.image_token = image_token_of(root, self.geometry)
        token_id = self.text.hf.convert_tokens_to_ids(self.image_token)
        if token_id is None or token_id == self.text.hf.unk_token_id:
            raise DatasetError(
                f"--processor {processor}: the tokenizer has no {self.image_token!r} token, "
                "so images cannot be placed; is this the model's own processor?"
            )
        self.image_token_id = int(token_id)
        self.max_image_pixels = max_image_pixels

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer, as the text path names it."""
        return self.text.tokenizer

    def describe(self) -> str:
        """The chat template records are rendered with (as the text path's ``describe``)."""
        return self.text.describe()

    def provenance(self) -> dict[str, Any]:
        """What the cost index stores about the processor (``extra.vision``)."""
        return {
            "processor": os.path.basename(self.processor_dir),
            "geometry": self.geometry.to_dict(),
            "image_token": self.image_token,
            FINGERPRINT_KEY: processor_fingerprint(self.processor_dir),
        }

    def encode(self, record: ImageRecord, source: str) -> ImageEncoded:
        """Ids, mask and components of one record. Raises
        :class:`~bcl_stream.vision.image_header.ImageError` (a bad image, with its reason) or
        :class:`~bcl_stream.text.templates.TemplateError`."""
        sizes = []
        for i, data in enumerate(record.images):
            sizes.append(image_size(data, f"{source} image {i}", max_pixels=self.max_image_pixels))
        try:
            counts = [self.geometry.tokens(w, h) for w, h in sizes]
            patches = tuple(self.geometry.patches(w, h) for w, h in sizes)
        except ImageSizeError as exc:
            raise ImageError(f"{source}: {exc}", "image_aspect") from exc
        base = self.text.conversation(record.conversation)
        at = np.flatnonzero(base.ids == self.image_token_id)
        if at.size != len(sizes):
            raise TemplateError(
                f"the chat template rendered {at.size} {self.image_token} tokens for "
                f"{len(sizes)} images; the record's text must not hold the image token itself"
            )
        out = expand(base, at, counts)
        return ImageEncoded(out.ids, out.spans, record.images, tuple(sizes), sum(counts), patches)


def image_token_of(root: Path, geometry: ImageGeometry) -> str:
    """The processor's image token: ``processor_config.json``'s ``image_token`` if it names
    one, else the family's (Qwen2-VL ``<|image_pad|>``, LLaVA ``<image>``)."""
    import json

    path = root / PROCESSOR_CONFIG
    if path.is_file():
        try:
            token = json.loads(path.read_text()).get("image_token")
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path}: unreadable JSON ({exc})") from exc
        if isinstance(token, str) and token:
            return token
    return "<|image_pad|>" if geometry.family == "qwen2_vl" else "<image>"


def expand(base: Encoded, at: npt.NDArray[np.int64], counts: list[int]) -> Encoded:
    """``base`` with the image token at each position ``at[k]`` repeated ``counts[k]`` times;
    the loss spans moved past the expansions (an image token is never trained)."""
    ids = base.ids
    repeats = np.ones(ids.size, dtype=np.int64)
    repeats[at] = counts
    out = np.repeat(ids, repeats).astype(np.uint32)
    if base.spans is None:
        return Encoded(out)
    shift = np.concatenate([[0], np.cumsum(repeats - 1)])  # added before position p
    spans = base.spans.astype(np.int64)
    moved = spans + shift[spans]
    return Encoded(out, moved.astype(np.uint32))
