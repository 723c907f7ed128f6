"""The core (``bcl_stream``) stands without the Lightning edge: no module of it imports
``lightning_module`` or ``lightning``, at the top or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "bcl_stream"


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_core_never_imports_the_lightning_edge() -> None:
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 40
    offenders = {
        str(p.relative_to(CORE)): sorted(imported_roots(p) & {"lightning_module", "lightning"})
        for p in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}
