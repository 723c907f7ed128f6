"""Every relative link of README.md and docs/*.md resolves: the file (or folder) exists in the
repository, and a ``#anchor`` names a heading of the page it points to.

Why: result sections and pages move between the README and docs/; a link left pointing at the
old place is a dead end a reader meets first. Anchors follow GitHub's rule (lower case,
punctuation dropped but ``-`` and ``_``, spaces to hyphens, ``-1``, ``-2`` for repeats). Links in
code (fenced blocks and inline code) are not links and are skipped; absolute URLs are not
checked (no network in tests).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+).*?\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str, *, keep_inline_code: bool = False) -> list[tuple[int, str]]:
    """``(line number, text)`` outside fenced code, inline code removed unless kept (a
    heading's code spans are part of its anchor)."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if opening:
            mark = opening.group(1)
            if fence is None:
                fence = mark
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
                continue
        if fence is None:
            out.append((number, line if keep_inline_code else INLINE_CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(text, keep_inline_code=True):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """``file:line: link: why`` for every relative link of ``page`` that does not resolve."""
    found: list[str] = []
    name = page.relative_to(root)
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1)
            if SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            where = page if not path_part else (page.parent / path_part).resolve()
            if not where.exists():
                found.append(f"{name}:{number}: {target}: no such file")
                continue
            try:
                where.relative_to(root.resolve())
            except ValueError:
                found.append(f"{name}:{number}: {target}: points outside the repository")
                continue
            if anchor and where.suffix == ".md":
                page_anchors = anchors(where.read_text(encoding="utf-8"))
            else:
                page_anchors = {anchor}  # no anchor, or one into a file that has no headings
            if anchor not in page_anchors:
                found.append(f"{name}:{number}: {target}: no heading with anchor #{anchor}")
    return found


def test_every_relative_link_resolves() -> None:
    found: list[str] = []
    for page in doc_files():
        found += broken_links(page)
    assert not found, "\n".join(found)


def test_the_pages_hold_links() -> None:
    """The check reads something: the README links its pages and results."""
    lines = prose_lines((ROOT / "README.md").read_text(encoding="utf-8"))
    targets = [m.group(1) for _, line in lines for m in LINK.finditer(line)]
    assert any(t.startswith("docs/") for t in targets)
    assert any(t.startswith("results/") for t in targets)


def test_planted_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text(
        "# Other page\n\n## Record contracts: `pack` and `step`\n\n## Same\n\n## Same\n"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "See [ok](docs/other.md), [anchor](docs/other.md#record-contracts-pack-and-step),\n"
        "[repeat](docs/other.md#same-1), [web](https://example.org/x), ![pic](docs/gone.png),\n"
        "[bad anchor](docs/other.md#nothing), [self](#top-heading), `[code](docs/x.md)`.\n"
        "```\n[in a block](docs/nothing.md)\n```\n"
        "[outside](../elsewhere.md)\n"
        "# Top heading\n"
    )
    (tmp_path.parent / "elsewhere.md").write_text("x")
    assert broken_links(page, tmp_path) == [
        "README.md:2: docs/gone.png: no such file",
        "README.md:3: docs/other.md#nothing: no heading with anchor #nothing",
        "README.md:7: ../elsewhere.md: points outside the repository",
    ]


def test_slug_follows_github() -> None:
    assert slug("Measured (tools/bench_loader.py)") == "measured-toolsbench_loaderpy"
    assert slug('Variable micro-batches: `contract="step"`') == (
        "variable-micro-batches-contractstep"
    )
