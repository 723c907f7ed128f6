"""Derive a sizes file of ``bcl_bench/data/`` from a COCO-format annotation file.

One row per image in the file's own ``images`` order: ``image_id``, ``width``, ``height`` and,
for a captions file (annotations with a ``caption``, as COCO's ``captions_val2017.json``),
``caption_tokens``: the cl100k token count of the image's first caption (the first annotation
of that image in the file) as a two-message chat record (user: the image alone, assistant: the
caption; ``bcl_bench.corpora.chat_tokens``). Sizes and counts only: no caption text, no pixels.

    python tools/coco_sizes.py annotations/captions_val2017.json
    python tools/coco_sizes.py TACO/data/annotations.json --out bcl_bench/data/taco_sizes.csv
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
from pathlib import Path

from bcl_bench.corpora import TOKENIZERS, chat_tokens

OUT = Path(__file__).resolve().parent.parent / "bcl_bench" / "data" / "coco_val2017_sizes.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("annotations", type=Path, help="a COCO-format annotation file")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    raw = args.annotations.read_bytes()
    data = json.loads(raw)
    first: dict[int, str] = {}
    for ann in data["annotations"]:
        if "caption" in ann:
            first.setdefault(int(ann["image_id"]), str(ann["caption"]))
    encoding = None
    if first:
        import tiktoken

        encoding = tiktoken.get_encoding(TOKENIZERS["cl100k"])
    with args.out.open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["image_id", "width", "height", *(["caption_tokens"] if first else [])])
        for image in data["images"]:
            row = [image["id"], image["width"], image["height"]]
            if encoding is not None:
                caption = first[int(image["id"])]
                record = {
                    "messages": [
                        {"role": "user", "content": ""},
                        {"role": "assistant", "content": caption},
                    ]
                }
                row.append(chat_tokens(record, encoding))
            writer.writerow(row)
    print(
        f"{len(data['images'])} images -> {args.out} "
        f"(source sha256 {hashlib.sha256(raw).hexdigest()})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
