"""An image's (width, height) from its header, without decoding a pixel.

Why: preprocessing needs each image's size (its patches and tokens follow from it,
:mod:`bcl_stream.vision.geometry`) and nothing else. ``PIL.Image.open`` parses the header and
stops; nothing here calls ``load()``, so the cost is the header's bytes, not the image's.

Every way an image can be bad is one :class:`ImageError` naming the record, with a ``reason``
(the preprocess report's key under ``--skip-bad``) and what to do:

- ``image_missing``: the file a record names does not exist;
- ``image_empty``: zero bytes, or a side of zero pixels;
- ``image_unreadable``: an unknown format, or a damaged or truncated header;
- ``image_too_large``: more pixels than ``max_pixels`` (a decompression bomb: a small file
  that would decode to gigabytes; PIL's own limit, ``Image.MAX_IMAGE_PIXELS``, by default);
- ``image_aspect``: a shape the model's processor refuses (aspect ratio above 200; raised by
  :mod:`bcl_stream.vision.encode` from the geometry).

Damage *after* the header is not seen here (no pixel is read); the DataLoader worker that
decodes the image reports it, naming the record.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from bcl_stream.errors import DatasetError

IMAGE_REASONS = (
    "image_missing",
    "image_empty",
    "image_unreadable",
    "image_too_large",
    "image_aspect",
)


class ImageError(DatasetError):
    """A record's image cannot be used: ``reason`` is one of :data:`IMAGE_REASONS`."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def default_max_pixels() -> int:
    """PIL's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``, 89,478,485 by default)."""
    limit = Image.MAX_IMAGE_PIXELS
    return int(limit) if limit else 1 << 62


def image_size(
    image: bytes | str | os.PathLike[str], record: str, *, max_pixels: int | None = None
) -> tuple[int, int]:
    """(width, height) of ``image`` (its bytes or a path), read from the header only.

    ``record`` names the record in errors (``file:line`` or a shard key). ``max_pixels``:
    refuse larger images (None: :func:`default_max_pixels`).
    """
    limit = default_max_pixels() if max_pixels is None else max_pixels
    where = f"{record}: image" if isinstance(image, bytes) else f"{record}: image {image}"
    if not isinstance(image, bytes):
        path = Path(image)
        if not path.is_file():
            raise ImageError(
                f"{where} not found; fix the path (relative paths are resolved against the "
                "input file's directory) or drop the record",
                "image_missing",
            )
        if path.stat().st_size == 0:
            raise ImageError(f"{where} is an empty file (0 bytes); replace it", "image_empty")
    elif not image:
        raise ImageError(f"{where} is empty (0 bytes); replace it", "image_empty")
    source = io.BytesIO(image) if isinstance(image, bytes) else Path(image)
    try:
        with warnings.catch_warnings():
            # The size is compared with ``limit`` below; PIL's warning would only repeat it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as im:  # parses the header; no load()
                width, height = im.size
    except Image.DecompressionBombError as exc:
        raise ImageError(
            f"{where} is a decompression bomb ({exc}); drop the record or re-encode the image "
            "smaller",
            "image_too_large",
        ) from exc
    except UnidentifiedImageError as exc:
        raise ImageError(
            f"{where} is not an image PIL can read (unknown format or damaged header); "
            "re-encode it as JPEG/PNG/WebP or drop the record",
            "image_unreadable",
        ) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(
            f"{where} has a damaged or truncated header ({exc}); re-encode it or drop the record",
            "image_unreadable",
        ) from exc
    if width < 1 or height < 1:
        raise ImageError(f"{where} is {width}x{height} pixels (a side is zero)", "image_empty")
    if width * height > limit:
        raise ImageError(
            f"{where} is {width}x{height} = {width * height} pixels, above the limit of {limit} "
            "(a decompression bomb, or an image far larger than any model resizes to); "
            "re-encode it smaller or drop the record",
            "image_too_large",
        )
    return width, height
