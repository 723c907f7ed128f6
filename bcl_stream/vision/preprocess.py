"""The preprocessing side of image-text records: what the writer stores per record, and the
cost components it seals beside the cost index.

``preprocess --processor DIR`` keeps one :class:`ImageColumns` beside its writer. Every record
written passes :meth:`ImageColumns.admit` (an image record is never truncated: half an image's
tokens would match no processor output) and :meth:`ImageColumns.fields` (its images in the
shard, :mod:`bcl_stream.vision.storage`, and its components collected: 4 ints per record plus
one per image, in memory until the end). :meth:`ImageColumns.seal` writes
``bcl_components.npz`` into the writer's local directory and names it in the index's sealed
``extra`` before the index is written, with the processor's geometry (``extra.vision``).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from bcl_stream.records.kind import Bad
from bcl_stream.text.templates import Encoded
from bcl_stream.vision.components import COMPONENTS_KEY, RecordComponents, write_components
from bcl_stream.vision.encode import ImageEncoded, ImageTextEncoder
from bcl_stream.vision.storage import MDS_IMAGE_COLUMNS, image_fields

VISION_KEY = "vision"
"""``extra.vision`` of an image-text index: processor name, geometry, image token."""


class ImageColumns:
    """Image fields and cost components of the records one writer writes."""

    def __init__(self, fmt: str, encoder: Any) -> None:
        if not isinstance(encoder, ImageTextEncoder):
            raise TypeError("ImageColumns needs the ImageTextEncoder of --processor")
        self.format = fmt
        self.encoder = encoder
        self._pending: ImageEncoded | None = None
        self._text = array("q")
        self._image = array("q")
        self._counts = array("q")
        self._patches = array("q")

    @property
    def mds_columns(self) -> dict[str, str]:
        """Columns the MDS writer adds (the WebDataset writer needs none declared)."""
        return dict(MDS_IMAGE_COLUMNS) if self.format == "mds" else {}

    def admit(
        self, source: str, result: Encoded, max_tokens: int | None, policy: str
    ) -> ImageEncoded | Bad:
        """``result`` (an image-text record's :class:`ImageEncoded`, or a text record's
        :class:`Encoded`: no image) if it may be written as the outlier policy would leave it,
        else why not (a record with images above ``max_tokens`` under ``truncate``)."""
        encoded = (
            result if isinstance(result, ImageEncoded) else ImageEncoded(result.ids, result.spans)
        )
        n = int(encoded.ids.size)
        if encoded.images and max_tokens is not None and n > max_tokens and policy == "truncate":
            return Bad(
                source,
                "outlier_with_images",
                f"{n} tokens (with {encoded.image_tokens} image tokens) is above "
                f"--max-record-tokens {max_tokens}, and a record with images is not truncated "
                "(its image tokens would no longer match its images); raise the limit, lower "
                "the processor's max_pixels, or use --outliers drop",
            )
        self._pending = encoded
        return encoded

    def fields(self) -> dict[str, Any]:
        """The admitted record's image fields; its components are kept (it is written now)."""
        encoded, self._pending = self._pending, None
        if encoded is None:
            raise RuntimeError("fields() without a record admitted before it")
        self._text.append(encoded.text_tokens)
        self._image.append(encoded.image_tokens)
        self._counts.append(len(encoded.patches))
        self._patches.extend(encoded.patches)
        return image_fields(encoded.images, encoded.sizes, self.format)

    def components(self) -> RecordComponents:
        """The components of every record written so far."""
        offsets = np.zeros(len(self._counts) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self._counts, dtype=np.int64), out=offsets[1:])
        return RecordComponents(
            np.frombuffer(self._text, dtype=np.int64).copy(),
            np.frombuffer(self._image, dtype=np.int64).copy(),
            offsets,
            np.frombuffer(self._patches, dtype=np.int64).copy(),
        )

    def seal(self, writer: Any) -> None:
        """Write the components into the writer's local directory and name them (with the
        processor's geometry) in its ``extra``; call before ``writer.finish()``."""
        writer.extra[COMPONENTS_KEY] = write_components(writer.local, self.components())
        writer.extra[VISION_KEY] = self.encoder.provenance()
