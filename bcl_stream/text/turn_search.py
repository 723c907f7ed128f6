"""Locating a turn on a rendering by rendering it again with a marker (``text/templates.py``).

Used where a chat template is not prefix-stable: ``messages[:i+1]`` does not render as a
prefix of the full conversation (Qwen3 renders the empty ``<think>`` block only after the last
user turn), so a turn's range cannot be read off the prefix renderings. Rendering the same
messages with :data:`MARK` after the turn's content changes the rendering only inside that
turn: where the two first differ and where their common suffix starts bracket the content.
"""

from __future__ import annotations

from typing import Any

MARK = "\x00bcl-turn-end\x00"
"""Appended to a turn's content to find where the content ends in a rendering."""


def marked(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with :data:`MARK` after its content (text parts: after the last part)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": MARK}]}
    return {**message, "content": (content or "") + MARK}


def header_end(prompt: str, full: str, first: int) -> int:
    """Where the generation prompt ends in ``full`` before character ``first`` (the turn's
    content): its last occurrence there, or that of its longest part ending a line (Qwen3's
    prompt without thinking ends in an empty <think> block a non-final turn does not have);
    -1: none found."""
    cuts = [len(prompt)] + [k + 1 for k in range(len(prompt) - 2, -1, -1) if prompt[k] == "\n"]
    for cut in cuts if prompt else []:
        at = full.rfind(prompt[:cut], 0, first)
        if at >= 0:
            return at + cut
    return -1


def common_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share (a binary search over slice
    comparisons, which run in C: a character loop in Python cost a fifth of the encoding time
    of a template that is not prefix-stable)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def common_suffix(a: str, b: str, limit: int) -> int:
    """How many trailing characters ``a`` and ``b`` share, at most ``limit``."""
    low, high = 0, min(len(a), len(b), limit)
    while low < high:
        mid = (low + high + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            low = mid
        else:
            high = mid - 1
    return low


def changed(text: str, other: str) -> tuple[int, int]:
    """(first character where ``text`` and ``other`` differ, start in ``text`` of their
    common suffix), the second at least the first."""
    first = common_prefix(text, other)
    suffix = common_suffix(text, other, min(len(text), len(other)) - first)
    return first, len(text) - suffix
