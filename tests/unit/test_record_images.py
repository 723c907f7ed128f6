"""Where a read sample's images are: those bcl-stream's writers stored (an MDS ``image_info``
column, a WebDataset listing of members), or, for a record read in place, the record's own
image fields (``records.image_text.record_images``)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from bcl_stream.errors import DatasetError
from bcl_stream.records.image_text import record_images
from bcl_stream.vision.storage import image_fields


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (9, 8, 7)).save(out, format="PNG")
    return out.getvalue()


def test_an_own_images_field_is_read_in_place_not_taken_for_a_listing() -> None:
    """A record whose ``images`` field holds image sources (bytes) is not a WebDataset
    listing of members: its images are read from the field, sizes from the headers."""
    a, b = png(5, 3), png(2, 7)
    sample = {"images": [a, b], "txt": "two squares", "sample_id": 4}
    assert record_images(sample, "record 4") == [(a, 5, 3), (b, 2, 7)]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_written_images_come_from_what_the_writer_stored(fmt: str) -> None:
    a = png(4, 4)
    sample = {"sample_id": 1, **image_fields((a,), ((4, 4),), fmt)}
    assert record_images(sample, "record 1") == [(a, 4, 4)]


def test_a_bad_image_read_in_place_is_one_line_naming_the_record() -> None:
    with pytest.raises(DatasetError, match=r"^shard.tar:0007 image 0: .*re-encode it") as got:
        record_images({"jpg": b"not an image", "txt": "x"}, "shard.tar:0007")
    assert "\n" not in str(got.value)
