"""tools/coco_sizes.py: each reader keeps its file's order and sizes, the MathVista reader writes
no caption column, and a file of neither shape or a problem without a size is refused in one
line naming the file and the problem."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tools import coco_sizes

MATHVISTA = {
    "1": {"question": "q one", "metadata": {"img_width": 1514, "img_height": 720}},
    "2": {"question": "q two", "metadata": {"img_width": 131, "img_height": 60}},
    "10": {"question": "q ten", "metadata": {"img_width": 5236, "img_height": 3491}},
}
COCO = {
    "images": [{"id": 7, "width": 640, "height": 480}, {"id": 3, "width": 427, "height": 640}],
    "annotations": [
        {"image_id": 3, "caption": "A cat."},
        {"image_id": 7, "caption": "Two dogs run on a beach at dusk."},
        {"image_id": 7, "caption": "A second caption, not used."},
    ],
}


def _run(tmp_path: Path, data: object) -> list[dict[str, str]]:
    src, out = tmp_path / "annotations.json", tmp_path / "sizes.csv"
    src.write_text(json.dumps(data))
    assert coco_sizes.main([str(src), "--out", str(out)]) == 0
    with out.open() as fh:
        return list(csv.DictReader(fh))


def test_mathvista_rows_keep_file_order_and_sizes_without_captions(tmp_path: Path) -> None:
    assert coco_sizes.read_rows(MATHVISTA) == [
        ("1", 1514, 720, None),
        ("2", 131, 60, None),
        ("10", 5236, 3491, None),
    ]
    rows = _run(tmp_path, MATHVISTA)
    assert list(rows[0]) == ["image_id", "width", "height"]
    assert [(r["image_id"], r["width"], r["height"]) for r in rows] == [
        ("1", "1514", "720"),
        ("2", "131", "60"),
        ("10", "5236", "3491"),
    ]


def test_coco_rows_take_each_images_first_caption(tmp_path: Path) -> None:
    assert coco_sizes.read_rows(COCO) == [
        (7, 640, 480, "Two dogs run on a beach at dusk."),
        (3, 427, 640, "A cat."),
    ]
    rows = _run(tmp_path, COCO)
    assert [r["image_id"] for r in rows] == ["7", "3"]
    assert int(rows[0]["caption_tokens"]) > int(rows[1]["caption_tokens"]) > 0


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"1": {"metadata": {"img_width": 10}}}, "problem '1'"),
        ({"4": {"metadata": {"img_width": 0, "img_height": 9}}}, "image '4'"),
        ([1, 2], "not a COCO-format file"),
    ],
)
def test_bad_file_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: object, named: str
) -> None:
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exc:
        coco_sizes.main([str(src), "--out", str(tmp_path / "out.csv")])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(src) in last and named in last
    assert not (tmp_path / "out.csv").exists()
