"""The docs' YAML examples use this release's keys: every ```yaml block of README.md and
docs/*.md parses, and each ``data`` section holds documented keys only (the grouped keys of
docs/config.md), never a flat key (refused). The shipped configs are held to the same rule in
``test_config_doc.py``; an example on a page is copied as often as a shipped file.

Checked on the parsed YAML, and the checker is run on a planted flat key to show it catches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_blocks import ROOT, doc_files, fenced_blocks
from test_config_doc import documented_keys, keys_of

YAML = {"yaml", "yml"}


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for every fenced yaml block."""
    return fenced_blocks(text, YAML)


def offences(text: str, name: str) -> list[str]:
    """``file:line: what`` for every yaml block that does not parse and every undocumented
    key of a ``data`` section."""
    found: list[str] = []
    known = documented_keys()
    for first, code in yaml_blocks(text):
        try:
            doc: Any = yaml.safe_load(code)
        except yaml.YAMLError as exc:
            found.append(f"{name}:{first}: the yaml block does not parse ({exc})")
            continue
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, dict):
            unknown = sorted(keys_of(data) - known)
            if unknown:
                found.append(
                    f"{name}:{first}: data keys {unknown} are not keys of this release "
                    "(docs/config.md lists the grouped keys)"
                )
    return found


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_every_yaml_example_uses_the_grouped_keys(path: Path) -> None:
    assert offences(path.read_text(encoding="utf-8"), path.name) == []


def test_the_sft_page_has_a_yaml_example() -> None:
    blocks = yaml_blocks((ROOT / "docs" / "sft.md").read_text(encoding="utf-8"))
    assert blocks, "docs/sft.md lost its sft.yaml example (test_sft_end_to_end.py runs it)"


def test_the_checker_catches_a_flat_key_and_a_broken_block() -> None:
    flat = "text\n```yaml\ndata:\n  data: d\n  pack_size: 2\n  plan: {window: 4}\n```\n"
    assert offences(flat, "x.md") == [
        "x.md:3: data keys ['pack_size'] are not keys of this release (docs/config.md lists "
        "the grouped keys)"
    ]
    grouped = flat.replace("  pack_size: 2\n  plan: {window: 4}", "  plan: {pack_size: 2}")
    assert offences(grouped, "x.md") == []
    broken = "```yaml\ndata: [\n```\n"
    assert offences(broken, "y.md")[0].startswith("y.md:2: the yaml block does not parse")
