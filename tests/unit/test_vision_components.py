"""Image-text cost components beside the cost index, and image sizes read from headers.

Components: built, round-tripped through ``bcl_components.npz`` (named and sealed in
``bcl_index.json``), an index without them reads as text-only, and every damage (missing,
edited, truncated, swapped, mismatched with the index's tokens) is refused naming the file.
Headers: the size comes without decoding, and each bad image (missing, empty, unknown format,
damaged header, decompression bomb) is one error naming the record with its reason.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bcl_stream.cost import get_preset
from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.io.index import CostIndex, ShardEntry, write_index
from bcl_stream.io.index_meta import COMPONENTS_FILE
from bcl_stream.vision.components import (
    COMPONENTS_KEY,
    RecordComponents,
    read_components,
    write_components,
)
from bcl_stream.vision.image_header import ImageError, image_size

RECORDS = [(10, 64, [256]), (7, 0, []), (3, 20, [16, 64]), (0, 4, [16])]


def _components() -> RecordComponents:
    return RecordComponents.build(RECORDS)


def _write(root: Path) -> CostIndex:
    comps = _components()
    extra = {COMPONENTS_KEY: write_components(root, comps)}
    index = CostIndex.build(
        comps.tokens, get_preset("llama3-8b"), [ShardEntry("s0", len(comps))], "mds", extra
    )
    write_index(root, index)
    return index


def test_build_shapes_and_accessors() -> None:
    c = _components()
    assert len(c) == 4 and c.n_images == 4
    assert c.text_tokens.tolist() == [10, 7, 3, 0]
    assert c.image_tokens.tolist() == [64, 0, 20, 4]
    assert c.image_offsets.tolist() == [0, 1, 1, 3, 4]
    assert c.patches_of(2).tolist() == [16, 64] and c.patches_of(1).tolist() == []
    assert c.tokens.tolist() == [74, 7, 23, 4]
    assert all(not getattr(c, f).flags.writeable for f in ("text_tokens", "image_patches"))
    both = RecordComponents.concatenate([c, c])
    assert both.image_offsets.tolist() == [0, 1, 1, 3, 4, 5, 5, 7, 8]
    assert both.patches_of(6).tolist() == [16, 64]
    s = c.summary()
    assert s["image_tokens"]["total"] == 88 and s["patches"]["total"] == 352
    assert s["records_with_images"] == 3 and s["images"] == 4


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"text_tokens": np.array([1, 2], dtype=np.int32)}, "int64"),
        ({"image_tokens": np.array([1, 2, 3], dtype=np.int64)}, "records"),
        ({"image_offsets": np.array([0, 2, 1], dtype=np.int64)}, "image_offsets"),
        ({"image_tokens": np.array([5, -1], dtype=np.int64)}, "negative"),
        ({"image_offsets": np.array([0, 0, 1], dtype=np.int64)}, "record 0 has 4 image tokens"),
    ],
)
def test_invalid_components_are_refused(fields: dict, match: str) -> None:
    base = {
        "text_tokens": np.array([1, 2], dtype=np.int64),
        "image_tokens": np.array([4, 0], dtype=np.int64),
        "image_offsets": np.array([0, 1, 1], dtype=np.int64),
        "image_patches": np.array([16], dtype=np.int64),
    }
    base.update(fields)
    with pytest.raises(ValueError, match=match):
        RecordComponents(**base)


def test_record_with_image_tokens_but_no_image_is_refused() -> None:
    with pytest.raises(ValueError, match="record 1 has 4 image tokens but no image"):
        RecordComponents.build([(1, 4, [16]), (1, 4, [])])


def test_round_trip_beside_the_index(tmp_path: Path) -> None:
    index = _write(tmp_path)
    got = read_components(tmp_path, index.tokens)
    assert got is not None
    want = _components()
    for name in ("text_tokens", "image_tokens", "image_offsets", "image_patches"):
        assert np.array_equal(getattr(got, name), getattr(want, name))
    entry = json.loads((tmp_path / "bcl_index.json").read_text())["extra"][COMPONENTS_KEY]
    assert entry["file"] == COMPONENTS_FILE and entry["records"] == 4 and entry["images"] == 4


def test_a_text_only_index_reads_as_none(tmp_path: Path) -> None:
    index = CostIndex.build([5, 6], get_preset("llama3-8b"), [ShardEntry("s0", 2)], "mds", {})
    write_index(tmp_path, index)
    assert read_components(tmp_path, index.tokens) is None


def test_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / COMPONENTS_FILE).unlink()
    with pytest.raises(CostIndexError, match=f"{COMPONENTS_FILE}: .*missing.*annotate --overwrite"):
        read_components(tmp_path)


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_damaged_file_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    _write(tmp_path)
    path = tmp_path / COMPONENTS_FILE
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # another dataset's valid components
        other = tmp_path / "other"
        write_components(other, RecordComponents.build([(1, 4, [16])] * 4))
        raw = bytearray((other / COMPONENTS_FILE).read_bytes())
    path.write_bytes(bytes(raw))
    with pytest.raises(CostIndexError, match=f"{COMPONENTS_FILE}: SHA-256 does not match"):
        read_components(tmp_path)


def test_components_disagreeing_with_the_index_tokens_are_refused(tmp_path: Path) -> None:
    index = _write(tmp_path)
    tokens = np.array(index.tokens, dtype=np.int64)
    tokens[2] += 1
    with pytest.raises(CostIndexError, match=r"record 2: 3 text \+ 20 image tokens.*stores 24"):
        read_components(tmp_path, tokens)


def test_an_edited_entry_is_refused_by_the_seal(tmp_path: Path) -> None:
    _write(tmp_path)
    meta = tmp_path / "bcl_index.json"
    doc = json.loads(meta.read_text())
    doc["extra"][COMPONENTS_KEY]["images"] = 5
    meta.write_text(json.dumps(doc))
    with pytest.raises(CostIndexError, match="field 'extra' was changed"):
        read_components(tmp_path)


# --- image headers -------------------------------------------------------------------------


def _encoded(width: int, height: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
def test_size_from_bytes_and_path(tmp_path: Path, fmt: str) -> None:
    data = _encoded(37, 11, fmt)
    assert image_size(data, "r.jsonl:1") == (37, 11)
    path = tmp_path / f"a.{fmt.lower()}"
    path.write_bytes(data)
    assert image_size(path, "r.jsonl:1") == (37, 11)


def test_no_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header is enough: a JPEG whose entropy-coded data is cut off still reports its size
    (a decode would fail), and ``load`` is never called."""
    data = _encoded(640, 480, "JPEG")
    called = []
    monkeypatch.setattr(Image.Image, "load", lambda self: called.append(1))
    assert image_size(data[: len(data) // 3], "r:1") == (640, 480)
    assert called == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"r.jsonl:3: image .*nope.png not found") as info:
        image_size(tmp_path / "nope.png", "r.jsonl:3")
    assert info.value.reason == "image_missing"


def test_empty_file_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "e.jpg").write_bytes(b"")
    for source in (tmp_path / "e.jpg", b""):
        with pytest.raises(ImageError, match=r"r:1: image.*empty") as info:
            image_size(source, "r:1")
        assert info.value.reason == "image_empty"


@pytest.mark.parametrize(
    "data",
    [b"this is not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 5, b"\xff\xd8\xff"],
)
def test_unknown_or_damaged_header(data: bytes) -> None:
    with pytest.raises(ImageError, match=r"shard-000.tar:key7: image .*(re-encode|drop)") as info:
        image_size(data, "shard-000.tar:key7")
    assert info.value.reason == "image_unreadable"
    assert isinstance(info.value, DatasetError)


@pytest.mark.parametrize(
    ("side", "match"),
    [
        (10000, r"r:2: image is 10000x10000 = 100000000 pixels, above the limit of 89478485"),
        (20000, r"r:2: image is a decompression bomb \(Image size \(400000000 pixels\)"),
    ],
)
def test_decompression_bomb_is_refused(side: int, match: str) -> None:
    """A PNG header claiming side x side pixels (a few hundred bytes): above PIL's limit
    (PIL warns; refused here) and above twice it (PIL's own error, named)."""
    with pytest.raises(ImageError, match=match) as info:
        image_size(_bomb_png(side, side), "r:2")
    assert info.value.reason == "image_too_large"


def test_a_lower_pixel_limit() -> None:
    with pytest.raises(ImageError, match="above the limit of 1000") as info:
        image_size(_encoded(40, 30, "PNG"), "r:2", max_pixels=1000)
    assert info.value.reason == "image_too_large"
    assert image_size(_encoded(40, 25, "PNG"), "r:2", max_pixels=1000) == (40, 25)


def _bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header says ``width x height`` (only the header chunk: never decoded)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
