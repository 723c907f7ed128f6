"""The Lightning adapter stays an adapter (issue 40's targets, kept by a test):

- ``lightning_module`` imports the public face of ``bcl_stream`` (``bcl_stream/__init__.py``)
  plus at most 5 named internal modules (:data:`INTERNAL`): what it needs of the core beyond
  the face goes through ``bcl_stream.training``, the surface every trainer builds on;
- ``BCLDataModule.__init__`` is at most 40 lines and no function of ``lightning_module`` is
  longer than 80 (the training rules live in the core's resolve step, not here).

Read from the source with ``ast``; the checker is run on planted offences to show it catches
them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lightning_module"
INTERNAL = frozenset(
    {
        "bcl_stream.training",  # the resolve step and what a trainer adapter builds on
        "bcl_stream.io.streaming_compat",  # streaming's process layout, its shared memory
        "bcl_stream.loading.evaluation",  # validation and test readers
        "bcl_stream.errors",  # the CLI's one-line report (report, DEBUG_ENV)
        "bcl_stream.commands.config_options",  # docs/config.md from the knobs' docstrings
    }
)
"""The internal modules of ``bcl_stream`` the adapter may import, and why each."""


def core_imports(source: str) -> set[str]:
    """The ``bcl_stream`` modules ``source`` imports (``from X import ...``, ``import X``),
    the face (``bcl_stream`` itself) included."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {n for n in names if n == "bcl_stream" or n.startswith("bcl_stream.")}
    return found


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function of ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


def test_the_adapter_imports_the_face_and_five_named_modules() -> None:
    used = set()
    for path in sorted(PACKAGE.glob("*.py")):
        used |= core_imports(path.read_text(encoding="utf-8"))
    assert "bcl_stream" in used
    assert used - {"bcl_stream"} <= INTERNAL, sorted(used - {"bcl_stream"} - INTERNAL)
    assert len(INTERNAL) <= 5


def test_no_adapter_function_is_long_and_the_datamodule_init_is_short() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        assert long_functions(path.read_text(encoding="utf-8"), 80) == [], path.name
    tree = ast.parse((PACKAGE / "datamodule.py").read_text(encoding="utf-8"))
    (init,) = [
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "BCLDataModule"
        for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    ]
    assert (init.end_lineno or 0) - init.lineno + 1 <= 40


def test_the_checks_catch_planted_offences() -> None:
    planted = "from bcl_stream.epoch.plan import PACKINGS\nimport bcl_stream.cost\n"
    assert core_imports(planted) == {"bcl_stream.epoch.plan", "bcl_stream.cost"}
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    assert long_functions(f"def f():\n{body}\n", 80) == [("f", 82)]
