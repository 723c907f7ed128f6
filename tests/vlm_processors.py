"""Real Hugging Face VLM processor directories, built offline (shared test helper).

:func:`qwen2_vl_processor_dir` saves a ``Qwen2VLProcessor``: a small trained BPE tokenizer
(:func:`tests.hf_tokenizers.build_tokenizer_dir`) with Qwen2-VL's special tokens, wrapped as a
``Qwen2TokenizerFast`` (the processor accepts no other class), Qwen2-VL's official chat template
(``tests/unit/fixtures/chat_templates/qwen2_vl.jinja``), a ``Qwen2VLImageProcessor`` with small
pixel bounds and the required video processor. :func:`llava_processor_dir` saves a
``LlavaProcessor`` (CLIP 336 px tile, patch 14: 576 image tokens). ``AutoProcessor`` loads
both from the directory, as it loads a model's.

Kept free of pytest so tools can import it.
"""

from __future__ import annotations

from pathlib import Path

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
