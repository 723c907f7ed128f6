"""Official chat templates of common model families, and ``{% generation %}`` variants of each
that render byte for byte the same text (shared test helper; the measurement tool
``tools/check_chat_templates.py`` uses it too).

The templates are stored as the model repositories ship them in ``tokenizer_config.json``
(``tests/unit/fixtures/chat_templates/``, sources in the README there). A variant wraps what an
assistant turn writes after its header (content, reasoning, tool calls and the end-of-turn
tokens) in ``{% generation %}...{% endgeneration %}``, so ``apply_chat_template(...,
return_assistant_tokens_mask=True)`` under the variant is the oracle for the masks bcl-stream
finds by rendering the original; ``tests/unit/test_official_templates.py`` checks that the
variant renders exactly what the original renders.

Kept free of pytest so tools can import it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bcl_stream.text.generation_variants import generation_variant as package_variant

FIXTURES = Path(__file__).parent / "unit" / "fixtures" / "chat_templates"
PUBLIC_DATA = Path(__file__).parent / "unit" / "fixtures" / "sft_public"
FAMILIES = ("qwen3", "llama3_1", "llama3", "gemma3")
SPECIAL = {
    "qwen3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"],
    "llama3_1": [
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "gemma3": ["<bos>", "<start_of_turn>", "<end_of_turn>"],
}
"""Each family's special tokens (added to a small test tokenizer so they stay one id)."""
BOS_EOS = {
    "qwen3": (None, "<|im_end|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma3": ("<bos>", "<end_of_turn>"),
}


def official(family: str) -> str:
    """The family's official template, as its tokenizer_config.json has it."""
    return (FIXTURES / f"{family}.jinja").read_text(encoding="utf-8")


def generation_variant(family: str) -> str:
    """The official template with its assistant turns in ``{% generation %}`` tags (the
    package's variant, ``text/generation_variants.py``)."""
    variant = package_variant(official(family))
    if variant is None:
        raise ValueError(f"{family}: the fixture's template is not recognised by its hash")
    return variant


def tokenizer_dir(root: Path, family: str, template: str | None = None) -> Path:
    """A small trained tokenizer (tests/hf_tokenizers.py) carrying the family's special
    tokens, BOS/EOS and ``template`` (default: the official one)."""
    from tests.hf_tokenizers import build_tokenizer_dir

    bos, eos = BOS_EOS[family]
    return build_tokenizer_dir(
        root,
        official(family) if template is None else template,
        extra_special=SPECIAL[family],
        bos=bos,
        eos=eos,
    )


def records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON array or JSON Lines file, LLaMA-Factory's v1 parts layout
    converted (:func:`from_parts_with_values`)."""
    text = path.read_text(encoding="utf-8-sig")
    if text.lstrip().startswith("["):
        rows = list(json.loads(text))
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [from_parts_with_values(r) for r in rows]


def from_parts_with_values(record: dict[str, Any]) -> dict[str, Any]:
    """LLaMA-Factory's v1 layout (content as ``{"type", "value"}`` parts of type ``text``,
    ``reasoning`` and ``tool_call``; ``reason_tool_use_demo_50.jsonl``), which bcl-stream
    does not read, as Hugging Face messages: text joined into ``content``, reasoning as
    ``reasoning_content`` (Qwen3's template renders it in ``<think>``), tool calls as
    ``tool_calls``. Other records unchanged."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not any(
        isinstance(m.get("content"), list) and m["content"] and "value" in m["content"][0]
        for m in messages
    ):
        return record
    out = []
    for m in messages:
        parts = m["content"]
        message: dict[str, Any] = {"role": m["role"]}
        message["content"] = "".join(p["value"] for p in parts if p["type"] == "text")
        reasoning = "".join(p["value"] for p in parts if p["type"] == "reasoning")
        if reasoning:
            message["reasoning_content"] = reasoning
        calls = [json.loads(p["value"]) for p in parts if p["type"] == "tool_call"]
        if calls:
            message["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        out.append(message)
    return {**record, "messages": out}
