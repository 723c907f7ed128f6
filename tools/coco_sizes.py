"""Derive a sizes file of ``bcl_bench/data/`` from an image annotation file.

One row per image in the file's own order: ``image_id``, ``width``, ``height`` and, for a
captions file (annotations with a ``caption``, as COCO's ``captions_val2017.json``),
``caption_tokens``: the cl100k token count of the image's first caption (the first annotation
of that image in the file) as a two-message chat record (user: the image alone, assistant: the
caption; ``bcl_bench.corpora.chat_tokens``). Sizes and counts only: no caption text, no pixels.

Two formats, one reader each, told apart by their shape:

- COCO (``{"images": [...], "annotations": [...]}``): COCO's own files, TACO's;
- MathVista (``{pid: {..., "metadata": {"img_width", "img_height"}}}``, its
  ``data/testmini.json``): sizes only; its questions are not captions.

    python tools/coco_sizes.py annotations/captions_val2017.json
    python tools/coco_sizes.py TACO/data/annotations.json --out bcl_bench/data/taco_sizes.csv
    python tools/coco_sizes.py MathVista/data/testmini.json \\
        --out bcl_bench/data/mathvista_testmini_sizes.csv
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
from pathlib import Path
from typing import Any

from bcl_bench.corpora import TOKENIZERS, chat_tokens

OUT = Path(__file__).resolve().parent.parent / "bcl_bench" / "data" / "coco_val2017_sizes.csv"

Row = tuple[object, int, int, str | None]
"""(image id, width, height, first caption or None where the file has no captions)."""


def coco_rows(data: dict[str, Any]) -> list[Row]:
    """A COCO-format file's images in its ``images`` order, each with its first caption where
    the file's annotations carry captions (every image must then have one)."""
    first: dict[int, str] = {}
    for ann in data.get("annotations", []):
        if "caption" in ann:
            first.setdefault(int(ann["image_id"]), str(ann["caption"]))
    rows: list[Row] = []
    for image in data["images"]:
        if first and int(image["id"]) not in first:
            raise ValueError(f"image {image['id']} has no caption in a captions file")
        caption = first[int(image["id"])] if first else None
        rows.append((image["id"], int(image["width"]), int(image["height"]), caption))
    return rows


def mathvista_rows(data: dict[str, Any]) -> list[Row]:
    """MathVista's problems in the file's order, keyed by ``pid``, each sized by its
    ``metadata.img_width`` and ``metadata.img_height``; no captions."""
    rows: list[Row] = []
    for pid, problem in data.items():
        meta = problem.get("metadata") if isinstance(problem, dict) else None
        if not isinstance(meta, dict) or "img_width" not in meta or "img_height" not in meta:
            raise ValueError(f"problem {pid!r} has no metadata.img_width and img_height")
        rows.append((pid, int(meta["img_width"]), int(meta["img_height"]), None))
    return rows


def read_rows(data: object) -> list[Row]:
    """The rows of a parsed annotation file, by the reader its shape names; every size must be
    positive."""
    if isinstance(data, dict) and "images" in data:
        rows = coco_rows(data)
    elif isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        rows = mathvista_rows(data)
    else:
        raise ValueError(
            "not a COCO-format file (an 'images' list) nor a MathVista problem file "
            "({pid: {'metadata': {'img_width', 'img_height'}}}); pass one of those"
        )
    for image_id, width, height, _ in rows:
        if width <= 0 or height <= 0:
            raise ValueError(f"image {image_id!r} has size {width} x {height}: expected > 0")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("annotations", type=Path, help="a COCO-format or MathVista file")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    raw = args.annotations.read_bytes()
    try:
        rows = read_rows(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        parser.error(f"{args.annotations}: {exc}")
    captions = any(caption is not None for *_, caption in rows)
    encoding = None
    if captions:
        import tiktoken

        encoding = tiktoken.get_encoding(TOKENIZERS["cl100k"])
    with args.out.open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["image_id", "width", "height", *(["caption_tokens"] if captions else [])])
        for image_id, width, height, caption in rows:
            row: list[object] = [image_id, width, height]
            if encoding is not None:
                record: dict[str, object] = {
                    "messages": [
                        {"role": "user", "content": ""},
                        {"role": "assistant", "content": caption},
                    ]
                }
                row.append(chat_tokens(record, encoding))
            writer.writerow(row)
    print(f"{len(rows)} images -> {args.out} (source sha256 {hashlib.sha256(raw).hexdigest()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
