"""Real Hugging Face VLM processor directories, built offline (shared test helper).

:func:`qwen2_vl_processor_dir` saves a ``Qwen2VLProcessor``: a small trained BPE tokenizer
(:func:`tests.hf_tokenizers.build_tokenizer_dir`) with Qwen2-VL's special tokens, wrapped as a
``Qwen2TokenizerFast`` (the processor accepts no other class), Qwen2-VL's official chat template
(``tests/unit/fixtures/chat_templates/qwen2_vl.jinja``), a ``Qwen2VLImageProcessor`` with small
pixel bounds and the required video processor. :func:`llava_processor_dir` saves a
``LlavaProcessor`` (CLIP 336 px tile, patch 14: 576 image tokens). ``AutoProcessor`` loads
both from the directory, as it loads a model's. :func:`image_text_inputs` writes image-text
inputs in every layout ``preprocess --processor`` reads (JSONL and Parquet).

Kept free of pytest so tools can import it.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from tests.official_templates import FIXTURES

QWEN2_VL_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
SMALL_MIN_PIXELS, SMALL_MAX_PIXELS = 4 * 28 * 28, 64 * 28 * 28
"""Test bounds: 4 to 64 LM tokens per image (the model's own: 4 to 16384)."""


def qwen2_vl_template() -> str:
    return (FIXTURES / "qwen2_vl.jinja").read_text(encoding="utf-8")


def qwen2_vl_processor_dir(
    root: str | Path,
    *,
    min_pixels: int = SMALL_MIN_PIXELS,
    max_pixels: int = SMALL_MAX_PIXELS,
) -> Path:
    """Save a Qwen2-VL processor into ``root``; output: ``root``."""
    from transformers import (
        Qwen2TokenizerFast,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    from tests.hf_tokenizers import build_tokenizer_dir

    root = Path(root)
    template = qwen2_vl_template()
    tok_dir = build_tokenizer_dir(
        root / "_tokenizer", template, extra_special=QWEN2_VL_SPECIAL, bos=None, eos="<|im_end|>"
    )
    tok = Qwen2TokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
    )
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=template,
    )
    processor.save_pretrained(str(root))
    return root


def llava_processor_dir(root: str | Path) -> Path:
    """Save a LLaVA-1.5 style processor (CLIP 336 px, patch 14, ``default`` strategy: 576
    tokens per image) into ``root``; output: ``root``."""
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor

    from tests.hf_tokenizers import build_tokenizer_dir

    root = Path(root)
    tok = AutoTokenizer.from_pretrained(
        build_tokenizer_dir(root / "_tokenizer", None, extra_special=["<image>"])
    )
    image_proc = CLIPImageProcessor(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
    )
    LlavaProcessor(
        image_processor=image_proc,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
    ).save_pretrained(str(root))
    return root


def image_bytes(width: int, height: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    """Random pixels of that size, encoded as ``fmt``."""
    rng = np.random.default_rng(seed + width * 131 + height)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def image_text_inputs(root: Path) -> tuple[list[str], list[list[bytes]]]:
    """A JSONL file (image parts by path and data URI, LLaVA placeholders, a text-only
    conversation) and a Parquet file (HF image dicts with bytes, captions); each record's
    image bytes in input order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "img").mkdir(parents=True)
    a, b, c = image_bytes(64, 40, "JPEG"), image_bytes(300, 20), image_bytes(9, 700, "WEBP")
    (root / "img" / "a.jpg").write_bytes(a)
    (root / "img" / "b.png").write_bytes(b)
    uri = "data:image/webp;base64," + base64.b64encode(c).decode()
    jsonl = [
        {"messages": [
            {"role": "user", "content": [{"type": "image", "image": "img/a.jpg"},
                                         {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A photo."}]},
        {"image": "img/b.png", "conversations": [
            {"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "Wide."}]},
        {"messages": [{"role": "user", "content": "no picture"},
                      {"role": "assistant", "content": "fine"}]},
        {"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": "and"},
                                         {"type": "image", "image": "img/a.jpg"}]},
            {"role": "assistant", "content": "Two."}]},
    ]  # fmt: skip
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in jsonl))
    d, e = image_bytes(640, 480, "JPEG"), image_bytes(100, 100)
    table = pa.table(
        {
            "image": [{"bytes": d, "path": None}, {"bytes": e, "path": "e.png"}],
            "caption": ["A large photo.", "A square."],
        }
    )
    pq.write_table(table, root / "captions.parquet")
    files = [str(root / "chat.jsonl"), str(root / "captions.parquet")]
    return files, [[a], [b], [], [c, a], [d], [e]]
