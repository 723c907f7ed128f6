"""Build what the VLM training command of docs/vlm.md ("Train it") reads, offline:

- ``processor/``: a Qwen2-VL processor (a small BPE tokenizer with Qwen2-VL's special tokens
  and official chat template, Qwen2-VL's image processor with small pixel bounds: 4 to 64
  image tokens per image), as ``tests/vlm_processors.py`` builds it;
- ``model/``: a tiny Qwen2-VL ``config.json`` (2 layers, one vision block) whose vocabulary and
  special ids are the processor's; ``HFCausalLM`` initialises it at random (no weights, no
  download);
- ``source/``: an img2dataset-style WebDataset shard (``NNN.jpg``, ``NNN.txt`` caption,
  ``NNN.json`` with the size) of synthetic pixels at the sizes of the first COCO val2017 images
  (``bcl_bench/data/coco_val2017_sizes.csv``: sizes no one here chose), and a JSONL of
  text-only conversations mixed in (every ``--text-every``-th record);
- ``mds/`` (or ``wds/``): the dataset ``bcl-stream preprocess --processor`` writes from them.

    python tools/vlm_data.py [--out DIR] [--records 64] [--format mds]

Captions and conversations are synthetic words; a caption has as many words as the COCO
caption's ``caption_tokens`` column says, so caption lengths vary as the real ones do.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bcl_stream.preprocess import preprocess  # noqa: E402
from lightning_module.config_paths import ROOT_ENV  # noqa: E402
from tests.hf_models import tiny_qwen2_vl_dir  # noqa: E402
from tests.vlm_processors import image_bytes, qwen2_vl_processor_dir  # noqa: E402

SIZES = ROOT / "bcl_bench" / "data" / "coco_val2017_sizes.csv"
WORK = Path("results") / "vlm" / "work"
"""Where the outputs go by default, under the root configs/cpu_vlm.yaml's relative paths
resolve against: ``$BCL_STREAM_ROOT`` where set (as ``python -m lightning_module`` reads it),
else the repository."""
WORDS = (
    "a", "man", "woman", "dog", "cat", "sits", "stands", "on", "the", "street", "table", "near",
    "two", "red", "blue", "small", "large", "with", "of", "in", "front", "building", "car",
    "train", "plate", "food", "field", "grass", "water", "sky", "white",
)  # fmt: skip


def coco_sizes(n: int) -> list[tuple[int, int, int]]:
    """(width, height, caption tokens) of the first ``n`` images of the CSV, in its order."""
    with SIZES.open(newline="") as fh:
        rows = [r for _, r in zip(range(n), csv.DictReader(fh), strict=False)]
    return [(int(r["width"]), int(r["height"]), int(r["caption_tokens"])) for r in rows]


def words(k: int, i: int) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(k))


def write_sources(source: Path, records: int, text_every: int) -> list[str]:
    """The img2dataset shard and the text-only JSONL; returns the input files."""
    source.mkdir(parents=True)
    n_text = records // text_every if text_every else 0
    sizes = coco_sizes(records - n_text)
    shard = source / "00000.tar"
    with tarfile.open(shard, "w") as tar:
        for i, (w, h, tokens) in enumerate(sizes):
            key = f"{i:09d}"
            members = {
                "jpg": image_bytes(w, h, "JPEG", seed=i),
                "txt": words(tokens, i).encode(),
                "json": json.dumps({"key": key, "width": w, "height": h}).encode(),
            }
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    files = [str(shard)]
    if n_text:
        chats = [
            {"messages": [
                {"role": "user", "content": words(4 + i % 7, i)},
                {"role": "assistant", "content": words(6 + (i * 5) % 40, i + 1)},
            ]}
            for i in range(n_text)
        ]  # fmt: skip
        (source / "text.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
        files.append(str(source / "text.jsonl"))
    return files


def build(out: Path, records: int, fmt: str, text_every: int) -> Path:
    """Write everything under ``out`` (its parts rebuilt); returns the dataset directory."""
    from transformers import AutoProcessor

    for part in ("processor", "model", "source", fmt):
        shutil.rmtree(out / part, ignore_errors=True)
    processor = qwen2_vl_processor_dir(out / "processor")
    tiny_qwen2_vl_dir(out / "model", AutoProcessor.from_pretrained(str(processor)))
    files = write_sources(out / "source", records, text_every)
    preprocess(files, str(out / fmt), format=fmt, processor=str(processor), progress=False)
    return out / fmt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="default: ROOT/results/vlm/work, ROOT the "
        "repository or $BCL_STREAM_ROOT (configs/cpu_vlm.yaml's paths move with it)"
    )  # fmt: skip
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--format", choices=("mds", "wds"), default="mds")
    parser.add_argument(
        "--text-every", type=int, default=4, help="every k-th record is text only (0: none)"
    )
    args = parser.parse_args(argv)
    root = Path(os.environ.get(ROOT_ENV) or ROOT)
    out = (args.out or root / WORK).resolve()
    data = build(out, args.records, args.format, args.text_every)
    print(f"wrote {data} (processor, model and sources beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
