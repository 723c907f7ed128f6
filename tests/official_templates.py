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


def _edit(text: str, old: str, new: str, count: int = 1) -> str:
    found = text.count(old)
    if found != count:
        raise ValueError(f"template edit expects {count} occurrence(s) of {old!r}, found {found}")
    return text.replace(old, new)


def generation_variant(family: str) -> str:
    """The official template with its assistant turns in ``{% generation %}`` tags."""
    t = official(family)
    if family == "qwen3":
        # Each branch's output is kept in variables, then written as header, what repeats the
        # generation prompt (not generated, so not trained), and the generated rest inside
        # the tags.
        t = _edit(
            t,
            "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')"
            " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}",
            "{%- set think = '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' %}"
            "{%- set body = content.lstrip('\\n') %}",
        )
        t = _edit(
            t,
            "{{- '<|im_start|>' + message.role + '\\n' + content }}",
            "{%- set think = '' %}{%- set body = content %}",
            2,
        )
        # Without thinking the prompt ends in '<think>\n\n</think>\n\n': the part of a think
        # block that repeats it is prompt (all of an empty block, '<think>\n' of another).
        t = _edit(
            t,
            "        {%- if message.tool_calls %}",
            "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
            "        {%- set rest = think %}\n"
            "        {%- if enable_thinking is defined and enable_thinking is false and think %}\n"
            "            {%- if think == '<think>\\n\\n</think>\\n\\n' %}{%- set rest = '' %}\n"
            "            {%- else %}{%- set rest = think[8:] %}{%- endif %}\n"
            "            {{- think[: think|length - rest|length] }}\n"
            "        {%- endif %}\n"
            "        {%- generation %}\n"
            "        {{- rest }}\n"
            "        {{- body }}\n"
            "        {%- if message.tool_calls %}",
        )
        return _edit(
            t,
            "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
            "{{- '<|im_end|>\\n' }}\n        {%- endgeneration %}\n"
            '    {%- elif message.role == "tool" %}',
        )
    if family == "llama3_1":
        t = _edit(
            t,
            "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
            "message['content'] | trim + '<|eot_id|>' }}",
            "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
            "        {%- if message['role'] == 'assistant' %}{% generation %}"
            "{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
            "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}",
        )
        t = _edit(
            t,
            "        {%- set tool_call = message.tool_calls[0].function %}\n",
            "        {%- set tool_call = message.tool_calls[0].function %}\n"
            "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            "        {%- generation %}\n",
        )
        t = _edit(
            t, "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n", "", 2
        )
        return _edit(
            t,
            '            {{- "<|eot_id|>" }}\n        {%- endif %}\n',
            '            {{- "<|eot_id|>" }}\n        {%- endif %}\n        {%- endgeneration %}\n',
        )
    if family == "llama3":
        return _edit(
            t,
            "{{ content }}",
            "{% if message['role'] == 'assistant' %}{{ content.split('<|end_header_id|>\n\n', 1)[0]"
            " + '<|end_header_id|>\n\n' }}{% generation %}"
            "{{ content.split('<|end_header_id|>\n\n', 1)[1] }}{% endgeneration %}"
            "{% else %}{{ content }}{% endif %}",
        )
    if family == "gemma3":
        old_body = t[
            t.index("    {%- if message['content'] is string -%}") : t.index(
                "{%- endfor -%}\n{%- if add_generation_prompt -%}"
            )
        ]
        return _edit(
            t,
            old_body,
            "    {%- if role == 'model' -%}{%- generation -%}\n" + old_body
            + "    {%- endgeneration -%}{%- else -%}\n" + old_body + "    {%- endif -%}\n",
        )  # fmt: skip
    raise ValueError(f"no variant for {family!r}; known: {FAMILIES}")


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
