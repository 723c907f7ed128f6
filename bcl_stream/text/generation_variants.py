"""``{% generation %}`` variants of common official chat templates, chosen by the template's hash.

A template that marks assistant turns with ``{% generation %}`` gives its masks in one
rendering (``apply_chat_template(..., return_assistant_tokens_mask=True)``), where locating the
turns by rendering costs several renderings per turn (``text/templates.py``), more where the
template is not prefix-stable (Qwen3). The official templates of Qwen3, Llama-3.1, Llama-3
and Gemma-3 carry no tags, so this module holds, for each, the edits that wrap what an
assistant turn writes after its header (reasoning, content, tool calls, end-of-turn tokens)
in the tags. The edits only move output into the tags: the
variant renders byte for byte what the official template renders, which the tests check on
public multi-turn data, along with masks equal to those found by rendering.

A template is recognised by the SHA-256 of its text, so any other template, an edited copy
included, is rendered and located as before. What repeats the generation prompt is not
marked (Qwen3 without thinking puts an empty ``<think>`` block into the prompt), as the
rendering method does.
"""

from __future__ import annotations

import hashlib

OFFICIAL = {
    "87a2728cb8dc9fe4": "qwen3",
    "e10ca381b1ccc5cf": "llama3_1",
    "93c0e9aa3629bbd7": "llama3_1",
    "ba03a121d097859c": "llama3",
    "7de1c58e208eda46": "gemma3",
}
"""The first 16 hex digits of each official template's SHA-256 -> its family (Llama-3.1's
with and without a final newline, which ``transformers``' Jinja environment drops)."""


def template_hash(template: str) -> str:
    """The first 16 hex digits of the SHA-256 of a template's text."""
    return hashlib.sha256(template.encode("utf-8")).hexdigest()[:16]


def family_of(template: str) -> str | None:
    """The family of an official template (None: not one of :data:`OFFICIAL`)."""
    return OFFICIAL.get(template_hash(template))


def generation_variant(template: str) -> str | None:
    """``template`` with its assistant turns in ``{% generation %}`` tags, where it is an
    official template this module knows; None otherwise."""
    family = family_of(template)
    return None if family is None else _variant(family, template)


def _edit(text: str, old: str, new: str, count: int = 1) -> str:
    found = text.count(old)
    if found != count:
        raise ValueError(f"template edit expects {count} occurrence(s) of {old!r}, found {found}")
    return text.replace(old, new)


def _qwen3(t: str) -> str:
    """Qwen3's template: each assistant turn's generated part in tags, the think block's
    part that repeats the generation prompt left out."""
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


def _llama3_1(t: str) -> str:
    """Llama 3.1's template: assistant turns and tool calls in tags."""
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


def _llama3(t: str) -> str:
    """Llama 3's template: an assistant turn's content after its header in tags."""
    return _edit(
        t,
        "{{ content }}",
        "{% if message['role'] == 'assistant' %}{{ content.split('<|end_header_id|>\n\n', 1)[0]"
        " + '<|end_header_id|>\n\n' }}{% generation %}"
        "{{ content.split('<|end_header_id|>\n\n', 1)[1] }}{% endgeneration %}"
        "{% else %}{{ content }}{% endif %}",
    )


def _gemma3(t: str) -> str:
    """Gemma 3's template: the model's turns in tags."""
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


_EDITS = {"qwen3": _qwen3, "llama3_1": _llama3_1, "llama3": _llama3, "gemma3": _gemma3}
"""Each family's edit of its official template: the assistant turns put in tags."""


def _variant(family: str, t: str) -> str:
    """The official template ``t`` of ``family`` with its assistant turns in tags."""
    edit = _EDITS.get(family)
    if edit is None:
        raise ValueError(f"no variant for {family!r}; known: {sorted(set(OFFICIAL.values()))}")
    return edit(t)
