"""Image-text records in the layouts their users have, read into a conversation plus images.

Layouts (each becomes a :class:`~bcl_stream.text.chat.Conversation` whose image parts are
``{"type": "image"}``, in order, and the list of those images' sources):

- **chat with image parts** (Hugging Face / OpenAI style): a message's ``content`` is a list of
  parts, among them ``{"type": "image", "image": SRC}`` (also ``"url"`` or ``"path"`` for the
  source) or ``{"type": "image_url", "image_url": {"url": SRC}}``;
- **LLaVA style**: ``<image>`` placeholders inside message text (ShareGPT ``conversations`` or
  ``messages``) and the record's ``image`` (one source) or ``images`` (a list) field, matched
  in order; a count that differs is a bad record;
- **caption** (img2dataset's layout: Parquet/JSONL with ``image`` + ``caption``/``txt``/
  ``text``): a user turn holding the image, and the caption as the assistant's answer, so the
  caption is what is trained.

As a record kind (:class:`ImageTextKind`, built and registered last in
``records/registry.py``, which hands it the encoding of records of any kind), a record
with an image field and no messages is image-text; without ``--processor`` it is refused
(``needs_processor``) rather than read as text with its image dropped.

A source is a path (relative to the input file's directory), a ``file://`` URL, a
``data:image/...;base64,`` URI, raw bytes (Parquet binary), or Hugging Face datasets' image
dict ``{"bytes": ..., "path": ...}``. Network URLs are refused (preprocessing reads no network).
The image's bytes are read here so they can be stored in the shards; its size comes from the
header (:mod:`bcl_stream.vision.image_header`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.io.streaming_compat import mds_image_file_bytes
from bcl_stream.records.chat import CHAT, MESSAGES_FIELDS
from bcl_stream.records.kind import Bad, Encoders, FoundColumns, Ids, LayoutOptions, finish
from bcl_stream.records.source import RecordSource
from bcl_stream.text.chat import Conversation
from bcl_stream.text.templates import Encoded, Encoder
from bcl_stream.vision.encode import ImageEncoded, ImageRecord, ImageTextEncoder
from bcl_stream.vision.image_header import ImageError, image_size
from bcl_stream.vision.storage import stored_images, writes_images

READER_KEYS = ("sample_id", "__key__", "__url__", "input_ids", "loss_spans")
"""Keys the readers add to a record (not its content)."""
IMAGE_TOKEN_LLAVA = "<image>"
"""LLaVA's placeholder in message text (one per image, in order)."""
IMAGE_FIELDS = ("image", "images", "jpg", "jpeg", "png", "webp")
"""A record's image field: ``image``/``images`` (JSONL, Parquet), or a WebDataset member's
extension (img2dataset writes ``jpg``)."""
CAPTION_FIELDS = ("caption", "txt", "text")
"""Where a caption record's text is (img2dataset writes ``txt``; its parquet ``caption``)."""
_MARK = "\x00bcl-image\x00"
"""Stands in for an image part while the text layout reader normalizes the messages (it
reads text parts only); put back as ``{"type": "image"}`` afterwards."""


def has_images(record: dict[str, Any]) -> bool:
    """Whether a parsed record is image-text (an image field, or an image part in a message)."""
    if any(record.get(name) is not None for name in IMAGE_FIELDS):
        return True
    for name in MESSAGES_FIELDS:
        messages = record.get(name)
        if isinstance(messages, list):
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list) and any(_is_image_part(p) for p in content):
                    return True
    return False


def _is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (
        part.get("type") in ("image", "image_url") or ("image" in part and "text" not in part)
    )


def _part_source(part: dict[str, Any]) -> Any:
    if part.get("type") == "image_url" or "image_url" in part:
        inner = part.get("image_url")
        return inner.get("url") if isinstance(inner, dict) else inner
    for key in ("image", "url", "path"):
        if part.get(key) is not None:
            return part[key]
    return None


def read_image_record(
    source: str, record: dict[str, Any], options: LayoutOptions, base: str | None
) -> ImageRecord | Bad:
    """One parsed record as a conversation plus image bytes, or why it is bad. ``base``: the
    directory relative image paths are resolved against (None: the working directory)."""
    field_sources = _field_images(record)
    if isinstance(field_sources, Bad):
        return Bad(source, field_sources.reason, field_sources.message)
    fields = CHAT.detect(record, options)
    if fields is None:
        return _caption_record(source, record, field_sources, base)
    raw_sources: list[Any] = []
    plain: dict[str, Any] = dict(record)
    if isinstance(record.get(fields[0]), list):
        plain[fields[0]] = [_marked_message(m, raw_sources) for m in record[fields[0]]]
    layout = CHAT.read(source, plain, fields)
    if isinstance(layout, Bad):
        return layout
    placeholders = sum(_count_llava(m) for m in layout.messages)
    if raw_sources and (placeholders or field_sources):
        return Bad(
            source,
            "bad_images",
            "the record has image parts and also <image> placeholders or an image field; "
            "give its images one way",
        )
    if placeholders or field_sources:
        if placeholders != len(field_sources):
            return Bad(
                source,
                "bad_images",
                f"{placeholders} {IMAGE_TOKEN_LLAVA} placeholders in the messages but "
                f"{len(field_sources)} images in its {'/'.join(IMAGE_FIELDS)} field; they must "
                "match one to one, in order",
            )
        raw_sources = list(field_sources)
    messages = [_unmarked(m) for m in layout.messages]
    images = _loaded_images(source, raw_sources, base)
    if isinstance(images, Bad):
        return images
    conv = Conversation(messages, layout.tools, layout.completion_from, layout.template_kwargs)
    return ImageRecord(conv, images)


def _loaded_images(source: str, raws: list[Any], base: str | None) -> tuple[bytes, ...] | Bad:
    """Every image's bytes, in order; the first that cannot be read makes the record bad
    (``image_missing`` for a file not found, so a moved image folder is told apart)."""
    images = []
    for i, raw in enumerate(raws):
        data = image_bytes(raw, base)
        if isinstance(data, str):
            return Bad(source, "image_missing" if "not found" in data else "bad_images",
                       f"image {i}: {data}")  # fmt: skip
        images.append(data)
    return tuple(images)


def _field_images(record: dict[str, Any]) -> list[Any] | Bad:
    for name in IMAGE_FIELDS:
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, list):
            return list(value)
        return [value]
    return []


def _caption_record(
    source: str, record: dict[str, Any], images: list[Any], base: str | None
) -> ImageRecord | Bad:
    caption = next((record[n] for n in CAPTION_FIELDS if isinstance(record.get(n), str)), None)
    if caption is None or not images:
        return Bad(
            source,
            "missing_field",
            f"an image-text record needs messages, or an image and a caption "
            f"({'/'.join(CAPTION_FIELDS)}); fields: {sorted(record)[:8]}",
        )
    if not caption.strip():
        return Bad(source, "no_trained_tokens", "the caption is empty: nothing to train")
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in images]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": caption}]},
    ]
    data = _loaded_images(source, images, base)
    if isinstance(data, Bad):
        return data
    return ImageRecord(Conversation(messages), data)


def _marked_message(message: Any, sources: list[Any]) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = []
    for part in message["content"]:
        if _is_image_part(part):
            sources.append(_part_source(part))
            parts.append({"type": "text", "text": _MARK})
        else:
            parts.append(part)
    return {**message, "content": parts}


def _count_llava(message: dict[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str):
        return content.count(IMAGE_TOKEN_LLAVA)
    if isinstance(content, list):
        return sum(
            p.get("text", "").count(IMAGE_TOKEN_LLAVA) for p in content if isinstance(p, dict)
        )
    return 0


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    """Image parts back in place of the marks; LLaVA ``<image>`` placeholders in text become
    image parts at their place (text before and after kept as text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        if IMAGE_TOKEN_LLAVA not in content:
            return message
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return message
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        text = part.get("text")
        if text == _MARK:
            parts.append({"type": "image"})
        elif isinstance(text, str) and IMAGE_TOKEN_LLAVA in text:
            pieces = text.split(IMAGE_TOKEN_LLAVA)
            for k, piece in enumerate(pieces):
                if k:
                    parts.append({"type": "image"})
                if piece:
                    parts.append({"type": "text", "text": piece})
        else:
            parts.append(part)
    return {**message, "content": parts}


def image_bytes(raw: Any, base: str | None) -> bytes | str:
    """The bytes of an image source (see the module docstring), or what is wrong with it."""
    if isinstance(raw, dict):
        if raw.get("bytes") is not None:
            raw = raw["bytes"]
        elif raw.get("path") is not None:
            raw = raw["path"]
        else:
            return f"an image object needs 'bytes' or 'path', got keys {sorted(raw)}"
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw)
    stored = mds_image_file_bytes(raw)  # an image streaming opened lazily from an MDS column
    if stored is not None:
        return stored
    if hasattr(raw, "getpixel"):
        return (
            "the column holds decoded pixels (an MDS 'pil' column), not an image file; store "
            "the image's file bytes (a 'bytes', 'jpeg' or 'png' column)"
        )
    if not isinstance(raw, str) or not raw:
        return f"an image source must be a path, data URI or bytes, got {type(raw).__name__}"
    if raw.startswith("data:"):
        head, _, payload = raw.partition(",")
        if not head.endswith(";base64"):
            return "a data URI image must be base64 (data:image/...;base64,...)"
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            return f"the data URI's base64 is invalid ({exc})"
    if raw.startswith(("http://", "https://", "s3://", "gs://")):
        return (
            f"{raw[:80]} is a network URL; preprocessing reads local images only (download "
            "them first, e.g. with img2dataset)"
        )
    path = Path(raw[len("file://") :] if raw.startswith("file://") else raw)
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return f"{path} not found; fix the path (relative to the input file) or drop the record"
    except OSError as exc:
        return f"{path} cannot be read ({exc})"


def record_images(sample: dict[str, Any], where: str) -> list[tuple[bytes, int, int]]:
    """(bytes, width, height) of each image of a read sample, in order: those bcl-stream's
    writers stored (``vision.storage.stored_images``), or, for a record of a dataset read in
    place (``annotate --processor``), those its encoding reads (sizes from the headers). A
    bad image is one line naming the record (:func:`in_place_error`)."""
    if writes_images(sample):
        return stored_images(sample, where)
    record = {k: v for k, v in sample.items() if k not in READER_KEYS}
    if not has_images(record):
        return []
    got = read_image_record(where, record, LayoutOptions(), None)
    if isinstance(got, Bad):
        raise in_place_error(got)
    return [(data, *image_size(data, f"{where} image {i}")) for i, data in enumerate(got.images)]


def input_dir(source: str) -> str | None:
    """The directory of a ``file:line`` record source (relative image paths start there)."""
    path = source.rsplit(":", 1)[0]
    return os.path.dirname(os.path.abspath(path)) if path else None


@functools.lru_cache(maxsize=4)
def processor_encoder(processor: str, loss_on: str | None) -> ImageTextEncoder:
    """The encoder of a processor directory, loaded once per process (the readers' and
    ``annotate``'s workers)."""
    return ImageTextEncoder(processor, loss_on or "assistant")


def in_place_error(bad: Bad) -> DatasetError:
    """A bad record of a dataset read or annotated in place: one line naming it, its reason
    and what to do (a record cannot be skipped there: the index counts every record)."""
    return DatasetError(
        f"{bad.source}: {bad.message} ({bad.reason}). A record cannot be left out of a dataset "
        "in place: replace or remove it in the shard, or write the dataset with `bcl-stream "
        "preprocess --processor DIR --skip-bad` from its records"
    )


def encode_image_record(
    source: str, record: dict[str, Any], encoder: ImageTextEncoder, layout: LayoutOptions
) -> ImageEncoded | Bad:
    """One parsed record holding images -> its :class:`ImageEncoded`, or why it is bad (a bad
    image under its reason: ``image_missing``, ``image_unreadable``, ...)."""
    got = read_image_record(source, record, layout, input_dir(source))
    if isinstance(got, Bad):
        return got
    return encode_images(source, got, encoder)


AnyEncoding = Callable[
    [str, dict[str, Any], ImageTextEncoder, LayoutOptions], ImageEncoded | Encoded | Bad
]
"""How a record under a processor is encoded, whatever its kind (``registry.encode_any``)."""


def encode_images(
    where: str, shape: ImageRecord, encoder: Encoder | ImageTextEncoder
) -> ImageEncoded | Bad:
    """An image-text shape under ``encoder`` (a processor's), or why it is bad: no processor
    (``needs_processor``), a bad image under its reason, nothing to train."""
    if not isinstance(encoder, ImageTextEncoder):
        return Bad(
            where,
            "needs_processor",
            "the record holds images; pass --processor DIR (the model's Hugging Face "
            "processor directory) to encode them, or drop the image field",
        )
    try:
        out = encoder.encode(shape, where)
    except ImageError as exc:
        message = str(exc)  # named by the source already: the report adds it again
        if message.startswith(where):
            message = message[len(where) :].lstrip(": ")
        return Bad(where, exc.reason, message)
    checked = finish(where, out)
    if not isinstance(checked, Bad):
        return out  # finish passes a record it accepts on unchanged
    if checked.reason == "no_trained_tokens":
        return Bad(
            where,
            "no_trained_tokens",
            f"the record has no token to train under --loss-on {encoder.text.loss_on} "
            "(no assistant turn with content)",
        )
    return checked


class ImageTextKind:
    """Image-text records (the module docstring) as a record kind. Detected last: a record
    whose only content is an image field and a caption (img2dataset's layout); records with
    image parts or ``<image>`` placeholders in their messages are read as image-text by
    ``preprocess --processor``, which looks at every record's content."""

    name = "image_text"
    shape: type = ImageRecord
    what = "an image column"
    knobs: tuple[str, ...] = ("processor", "loss_on")
    """A dataset annotated in place with ``--processor`` is read whole through it."""

    def __init__(self, encode_any: AnyEncoding) -> None:
        self.encode_any = encode_any
        """A record under a processor, with images or without (``registry.encode_any``): a
        dataset read in place holds both, and the text kinds are the registry's to pick."""

    def detect(self, names: Any, options: LayoutOptions) -> tuple[str, ...] | None:
        for name in IMAGE_FIELDS:
            if name in names:
                return (name,)
        return None

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        return read_image_record(where, record, LayoutOptions(), input_dir(where))

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        return encode_images(where, shape, encoder)

    def declared(self, found: FoundColumns) -> RecordSource:
        raise DatasetError(
            f"{found.where}: holds image column {found.fields[0]!r}: image-text records are "
            "encoded by the model's processor; pass --processor DIR (a local Hugging Face "
            "processor directory: tokenizer, chat template, preprocessor_config.json)"
        )

    def reads(self, source: RecordSource) -> bool:
        return source.processor is not None

    def stored(self, values: Any, source: RecordSource, where: str, encoders: Encoders) -> Ids:
        """A whole record (``values[0]``) of a dataset annotated with ``--processor``, encoded
        exactly as ``preprocess --processor`` encodes it."""
        assert source.processor is not None
        encoder = processor_encoder(source.processor, source.loss_on)
        record = {k: v for k, v in values[0].items() if k not in READER_KEYS}
        out = self.encode_any(where, record, encoder, LayoutOptions())
        if isinstance(out, Bad):
            raise in_place_error(out)
        return out.ids, out.spans
