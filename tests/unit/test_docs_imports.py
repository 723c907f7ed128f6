"""The docs import only from the public face: every ```python block of README.md and
docs/*.md parses, and imports the package as ``bcl_stream`` and ``lightning_module`` (their top
level), never from a module inside them.

Why: the modules inside ``bcl_stream`` move (a reader, a config, an index helper changes home as
the layers are straightened); ``bcl_stream``'s top level is the curated face that keeps the
names a user imports where they are. An example that imports
``bcl_stream.formats.mds_writer`` teaches users the one spelling a move breaks.

Checked on the syntax tree of each block, so a module path named in a comment or a string
neither trips nor hides anything; the checker is run on planted offences to show it catches
each spelling.
"""

from __future__ import annotations

import ast

import pytest
from doc_blocks import ROOT, doc_files, fenced_blocks

PUBLIC = ("bcl_stream", "lightning_module")
PYTHON = {"python", "py", "python3", "pycon"}


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for every fenced python block."""
    return fenced_blocks(text, PYTHON)


def _inside_face(module: str) -> bool:
    """``bcl_stream.x`` or ``lightning_module.x``: a module behind the public face."""
    root, _, rest = module.partition(".")
    return root in PUBLIC and bool(rest)


def offences(text: str, name: str) -> list[str]:
    """``file:line: what`` for every import of a module inside the face and every block that
    does not parse (an example a reader cannot run is wrong too)."""
    found: list[str] = []
    for first, code in python_blocks(text):
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            line = first + (exc.lineno or 1) - 1
            found.append(f"{name}:{line}: the python block does not parse ({exc.msg})")
            continue
        nodes = (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
        for node in sorted(nodes, key=lambda n: n.lineno):
            line = first + node.lineno - 1
            if isinstance(node, ast.ImportFrom) and node.module and _inside_face(node.module):
                top = node.module.split(".")[0]
                names = ", ".join(alias.name for alias in node.names)
                found.append(
                    f"{name}:{line}: 'from {node.module} import {names}' reaches inside the "
                    f"package; import it as 'from {top} import {names}'"
                )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _inside_face(alias.name):
                        top = alias.name.split(".")[0]
                        found.append(
                            f"{name}:{line}: 'import {alias.name}' reaches inside the package; "
                            f"import the names from '{top}'"
                        )
    return found


def test_docs_import_only_the_public_face() -> None:
    found: list[str] = []
    for path in doc_files():
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def imported_names(text: str) -> set[tuple[str, str]]:
    """``(package, name)`` of every ``from bcl_stream import name`` (or ``lightning_module``)
    in the python blocks of ``text``."""
    found: set[tuple[str, str]] = set()
    for _, code in python_blocks(text):
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue  # reported by the test above
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in PUBLIC:
                found.update((node.module, alias.name) for alias in node.names)
    return found


def test_every_name_the_docs_import_exists_at_the_top_level() -> None:
    """An example that imports a name the face does not export fails for the first user who
    runs it: each one resolves on its package."""
    import importlib

    wanted = set().union(*(imported_names(p.read_text(encoding="utf-8")) for p in doc_files()))
    assert wanted, "no top-level imports found in the docs"
    missing = sorted(
        f"from {package} import {name}"
        for package, name in wanted
        if not hasattr(importlib.import_module(package), name)
    )
    assert not missing, missing


def test_the_docs_have_python_examples() -> None:
    """The check above reads something: the README and the reader and writer pages hold
    examples (a fence the parser stopped seeing would pass vacuously)."""
    for page in ("README.md", "docs/readers.md", "docs/preprocessing.md"):
        assert python_blocks((ROOT / page).read_text(encoding="utf-8")), page


PLANTED = """\
Some prose naming bcl_stream.formats.mds_reader, which is fine.

```python
from bcl_stream import PackLoader
from lightning_module import BCLDataModule
import bcl_stream
# from bcl_stream.epoch.plan import ReaderConfig   (a comment: fine)
x = "from bcl_stream.io import index"               # a string: fine
```

```bash
python -c "from bcl_stream.cost import get_preset"  # not a python block
```

   ```py
   def f():
       from bcl_stream.formats.mds_writer import CostedMDSWriter
       import lightning_module.tinygpt
   ```

~~~python
from lightning_module.datamodule import BCLDataModule
~~~

```python
x = (
```
"""


def test_planted_offences_are_found_with_their_lines() -> None:
    found = offences(PLANTED, "planted.md")
    assert found == [
        "planted.md:17: 'from bcl_stream.formats.mds_writer import CostedMDSWriter' reaches "
        "inside the package; import it as 'from bcl_stream import CostedMDSWriter'",
        "planted.md:18: 'import lightning_module.tinygpt' reaches inside the package; import "
        "the names from 'lightning_module'",
        "planted.md:22: 'from lightning_module.datamodule import BCLDataModule' reaches inside "
        "the package; import it as 'from lightning_module import BCLDataModule'",
        "planted.md:26: the python block does not parse ('(' was never closed)",
    ]


@pytest.mark.parametrize(
    ("module", "inside"),
    [
        ("bcl_stream", False),
        ("lightning_module", False),
        ("bcl_stream.errors", True),
        ("lightning_module.tinygpt", True),
        ("numpy.random", False),
        ("bcl_streamx.y", False),
    ],
)
def test_inside_face(module: str, inside: bool) -> None:
    assert _inside_face(module) is inside
