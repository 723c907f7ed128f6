"""How an image-text record's images are stored in the shards, and read back.

Why the file bytes and not pixels: a JPEG is ~10x smaller than its pixels, and decoding belongs
in the DataLoader workers (:mod:`bcl_stream.vision.batch`), beside the rest of the batch work.

- **MDS**: column ``images`` (``bytes``: the record's image files concatenated) and
  ``image_info`` (``json``: one ``{"bytes", "width", "height"}`` per image, in order). MDS
  columns are fixed per dataset, so a text-only record stores ``b""`` and ``[]``.
- **Read in place** (a dataset ``annotate --processor`` counted: an img2dataset WebDataset's
  ``jpg`` member, an MDS image column): the images the record's encoding read, found the way
  ``records/image_text.py`` finds them, their sizes from the headers.
- **WebDataset**: one member per image, ``<key>.image<k>.<ext>`` (``jpg``, ``png``, ``webp``,
  ... from the file's magic bytes, so stock ``webdataset.decode("pil")`` decodes them), and
  ``images`` in the record's ``json`` member: ``[{"member", "width", "height"}]``. Members are
  covered by the record's xxh64 like every other member.
"""

from __future__ import annotations

from typing import Any

from bcl_stream.errors import DatasetError

MDS_IMAGE_COLUMNS = {"images": "bytes", "image_info": "json"}
IMAGES_KEY = "images"
INFO_KEY = "image_info"
_MAGIC = (
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
)


def extension(data: bytes) -> str:
    """The usual file extension of an encoded image (``bin`` when unknown)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    return "bin"


def image_fields(
    images: tuple[bytes, ...], sizes: tuple[tuple[int, int], ...], fmt: str
) -> dict[str, Any]:
    """The fields a writer stores for a record's images (``fmt``: ``mds`` or ``wds``)."""
    if fmt == "mds":
        info = [
            {"bytes": len(b), "width": w, "height": h}
            for b, (w, h) in zip(images, sizes, strict=True)
        ]
        return {IMAGES_KEY: b"".join(images), INFO_KEY: info}
    out: dict[str, Any] = {}
    listed = []
    for k, (data, (w, h)) in enumerate(zip(images, sizes, strict=True)):
        member = f"image{k}.{extension(data)}"
        out[member] = data
        listed.append({"member": member, "width": w, "height": h})
    out[IMAGES_KEY] = listed
    return out


def stored_images(sample: dict[str, Any], where: str) -> list[tuple[bytes, int, int]]:
    """(bytes, width, height) of each image a read sample stores (either format), in order;
    a sample without images gives ``[]``. A mismatch is a :class:`DatasetError` naming
    ``where`` (the shard and record)."""
    info = sample.get(INFO_KEY)
    if info is not None:  # MDS
        blob = sample.get(IMAGES_KEY) or b""
        out, at = [], 0
        for item in info:
            n = int(item["bytes"])
            out.append((bytes(blob[at : at + n]), int(item["width"]), int(item["height"])))
            at += n
        if at != len(blob):
            raise DatasetError(
                f"{where}: image_info lists {at} image bytes but the images column holds "
                f"{len(blob)}; the shard is damaged: re-run preprocess"
            )
        return out
    listed = sample.get(IMAGES_KEY)
    if listed is None:
        meta = sample.get("json")
        listed = meta.get(IMAGES_KEY) if isinstance(meta, dict) else None
    if listed is None:
        return _in_place_images(sample, where)
    out = []
    for item in listed or []:
        data = sample.get(item["member"])
        if not isinstance(data, (bytes, bytearray)):
            raise DatasetError(
                f"{where}: member {item['member']!r} named in the record's json is missing; "
                "the shard is damaged: re-run preprocess"
            )
        out.append((bytes(data), int(item["width"]), int(item["height"])))
    return out


def _in_place_images(sample: dict[str, Any], where: str) -> list[tuple[bytes, int, int]]:
    """The images of a record stored as its own tool wrote it (no ``image_info``, no listed
    members): those ``records/image_text.py`` reads for its encoding, sizes from the headers."""
    from bcl_stream.records.image_text import (
        READER_KEYS,
        has_images,
        in_place_error,
        read_image_record,
    )
    from bcl_stream.records.kind import Bad, LayoutOptions
    from bcl_stream.vision.image_header import image_size

    record = {k: v for k, v in sample.items() if k not in READER_KEYS}
    if not has_images(record):
        return []
    got = read_image_record(where, record, LayoutOptions(), None)
    if isinstance(got, Bad):
        raise in_place_error(got)
    out = []
    for i, data in enumerate(got.images):
        width, height = image_size(data, f"{where} image {i}")
        out.append((data, width, height))
    return out
