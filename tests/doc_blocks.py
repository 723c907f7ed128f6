"""The docs' fenced code blocks, for the tests that check them (imports, YAML keys) and the
test that runs docs/sft.md's example: one reader of README.md and docs/*.md, so every check
sees the same blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def doc_files() -> list[Path]:
    """README.md and every page under docs/ (sorted: messages in a stable order)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_blocks(text: str, languages: set[str]) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for every fenced block whose language
    is one of ``languages`` (an indented fence's indent is taken off its lines)."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if lang.lower() in languages:
            blocks.append((i + 2, "\n".join(body)))
        i = j + 1
    return blocks
