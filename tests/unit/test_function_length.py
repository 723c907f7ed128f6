"""No function of ``bcl_stream`` or ``lightning_module`` runs past :data:`MAX_LINES` lines,
read with ``ast`` (nothing is imported).

Why: a function that long does several jobs, and a reader has to hold all of them at once to
change one. A long function is split into helpers named for what each does, not cut into
chunks. The length counted is the ``def`` line through the last line of the body, docstring
included, decorators not (methods and nested functions each count on their own).

:data:`ALLOWED` lists the functions still over the limit, each with why; an entry whose
function is back under the limit (or gone) fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bcl_stream", "lightning_module")
MAX_LINES = 80

ALLOWED: Mapping[str, str] = {}
"""``path:qualified name`` -> why it is still longer than :data:`MAX_LINES`."""


def function_lengths(root: Path, packages: Sequence[str]) -> Iterator[tuple[str, int]]:
    """``(path:qualified name, lines)`` of every function and method under ``packages``."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), str(path))
            yield from _walk(tree, name, ())


def _walk(node: ast.AST, name: str, scope: tuple[str, ...]) -> Iterator[tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            qualified = (*scope, child.name)
            end = child.end_lineno if child.end_lineno is not None else child.lineno
            yield f"{name}:{'.'.join(qualified)}", end - child.lineno + 1
            yield from _walk(child, name, qualified)
        elif isinstance(child, ast.ClassDef):
            yield from _walk(child, name, (*scope, child.name))
        else:
            yield from _walk(child, name, scope)


def too_long(root: Path, packages: Sequence[str], limit: int = MAX_LINES) -> dict[str, int]:
    return {where: n for where, n in function_lengths(root, packages) if n > limit}


def test_no_function_is_longer_than_the_limit() -> None:
    found = {where: n for where, n in too_long(ROOT, PACKAGES).items() if where not in ALLOWED}
    assert not found, (
        f"functions over {MAX_LINES} lines (split them into helpers named for what they do): "
        + ", ".join(f"{where} ({n})" for where, n in sorted(found.items()))
    )


def test_every_allowed_function_is_still_too_long() -> None:
    over = too_long(ROOT, PACKAGES)
    back = sorted(set(ALLOWED) - set(over))
    assert not back, f"now within {MAX_LINES} lines or gone: remove from ALLOWED: {back}"


def test_the_measure_counts_methods_and_nested_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "@staticmethod\n"  # decorators are not counted
        f"def top():\n{body}\n"
        "class C:\n"
        f"    def method(self):\n        def inner():\n            pass\n{body.replace('    ', '        ')}\n"
    )
    lengths = dict(function_lengths(tmp_path, ("pkg",)))
    assert lengths == {"pkg/m.py:top": 6, "pkg/m.py:C.method": 8, "pkg/m.py:C.method.inner": 2}
    assert too_long(tmp_path, ("pkg",), limit=6) == {"pkg/m.py:C.method": 8}
