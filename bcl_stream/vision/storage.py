"""How an image-text record's images are stored in the shards, and read back.

Why the file bytes and not pixels: a JPEG is ~10x smaller than its pixels, and decoding belongs
in the DataLoader workers (:mod:`bcl_stream.vision.batch`), beside the rest of the batch work.

- **MDS**: column ``images`` (``bytes``: the record's image files concatenated) and
  ``image_info`` (``json``: one ``{"bytes", "width", "height"}`` per image, in order). MDS
  columns are fixed per dataset, so a text-only record stores ``b""`` and ``[]``.
- **Read in place** (a dataset ``annotate --processor`` counted: an img2dataset WebDataset's
  ``jpg`` member, an MDS image column): not here; ``records.image_text.record_images`` finds
  them as the record's encoding does (a record kind's parsing is above this layer).
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


def image_listing(sample: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The WebDataset listing ``[{"member", "width", "height"}]`` a written record carries
    (top level, or in its ``json`` member), or None: an MDS record, or a record read in place
    (whose own ``images`` field, if any, holds image sources, not a listing)."""
    for listed in (sample.get(IMAGES_KEY), _json_images(sample)):
        if isinstance(listed, list) and all(
            isinstance(item, dict) and "member" in item for item in listed
        ):
            return listed
    return None


def _json_images(sample: dict[str, Any]) -> Any:
    meta = sample.get("json")
    return meta.get(IMAGES_KEY) if isinstance(meta, dict) else None


def writes_images(sample: dict[str, Any]) -> bool:
    """Whether a read sample stores its images as bcl-stream's writers do (an MDS
    ``image_info`` column or a WebDataset listing); otherwise its images, if any, are where
    its own tool put them (``records.image_text.record_images`` finds them)."""
    return sample.get(INFO_KEY) is not None or image_listing(sample) is not None


def stored_images(sample: dict[str, Any], where: str) -> list[tuple[bytes, int, int]]:
    """(bytes, width, height) of each image a sample written by bcl-stream stores (either
    format), in order; a sample storing none gives ``[]`` (a record read in place:
    ``records.image_text.record_images``). A mismatch is a :class:`DatasetError` naming
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
    out = []
    for item in image_listing(sample) or []:
        data = sample.get(item["member"])
        if not isinstance(data, (bytes, bytearray)):
            raise DatasetError(
                f"{where}: member {item['member']!r} named in the record's json is missing; "
                "the shard is damaged: re-run preprocess"
            )
        out.append((bytes(data), int(item["width"]), int(item["height"])))
    return out
