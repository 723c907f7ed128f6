"""The first-party import graph of ``bcl_stream``, ``lightning_module`` and ``bcl_bench``, read with ``ast``
(nothing is imported): no import circle, no arrow from a lower layer to a higher one, and a
first-party import inside a function only where it defers a heavy library.

Layers, lowest first (:data:`LAYERS`; a module may import its own layer and those below):

1. ``errors``, then ``cost``: what everything raises and the cost models (numpy only);
2. ``planner``: the pure planning functions (numpy only, ``test_purity.py``), then ``peers``,
   the reproductions of other systems built on it, then ``process_layout`` (the one type of
   a job's data-parallel ranks and nodes);
3. ``text``: tokenizers, record layouts, chat templates, loss spans (what preprocess writes
   with and readers re-encode with);
   Then ``records/source.py`` and ``records/kind.py``: the record-source declaration and the
   record-kind protocol (what the plan records and every kind shares);
4. ``io``: dataset directory facts (``io/dataset_dir.py``), the cost index, remote stores,
   streaming's hooks; then ``vision``: image geometry, image headers, image-text components
   and batches;
5. ``epoch``: a reader's plan of an epoch, its cursor, mixtures;
6. ``formats``: readers, writers, integrity checks, ``open_dataset``; beside them ``records``,
   the record kinds and their registry (a kind reads columns with ``formats/token_ids.py``,
   the readers turn stored records into ids through the registry);
7. ``loading``: the loader that owns the cursor, collation (``vision/batch.py``'s image
   collate too: it finds a record's images as its record kind reads them), evaluation
   loaders, then
   ``training``: the knobs, the trainer's context and the resolve step every trainer calls;
8. ``preprocess``: records in, costed shards out;
9. ``analysis``: simulator, metrics, calibration, inspection;
10. ``bcl_stream`` itself (the public face, ``bcl_stream/__init__.py``), then ``commands``,
    then ``cli``;
11. ``lightning_module``, above the core;
12. ``bcl_bench``, what the benchmarks and scripts under ``tools/`` share, above everything.

Rules, each reported per file with its line:

- **cycle**: no circle in the module-level graph (imports at module level, those under
  ``if TYPE_CHECKING:`` included: a circle that only type checkers see still ties the two
  modules together); the message lists the circle's modules. Nor one closed by an
  import inside a function: a module imported late that imports its importer back at module
  level (whatever it defers, the two modules need each other).
- **upward**: no import of a higher layer, at module level, inside a function or under
  ``if TYPE_CHECKING:`` (a function that imports upward is the same layering fault, only
  later; a type-only one the same fault, seen by type checkers only). So ``bcl_stream`` never
  imports ``lightning_module``, in any form.
- **deferral**: an import inside a function is allowed only where the imported module's
  module-level import closure (its own imports, its packages' ``__init__``, transitively)
  reaches a heavy library (:data:`HEAVY`) that the importing module's own closure does not:
  the one reason to import late is to keep the caller light. Computed, not listed; anything
  else needs an entry with its reason in :data:`ALLOWED_DEFERRALS`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bcl_stream", "lightning_module", "bcl_bench")
HEAVY = frozenset(
    {
        "torch",
        "lightning",
        "lightning_fabric",
        "pytorch_lightning",
        "streaming",
        "webdataset",
        "transformers",
        "tokenizers",
        "tiktoken",
        "pyarrow",
        "boto3",
        "botocore",
        "matplotlib",
        "ray",
    }
)
"""Libraries that take seconds or hundreds of MB to import: worth an import inside a function."""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("bcl_stream.errors",),
    ("bcl_stream.cost",),
    ("bcl_stream.planner.*",),
    ("bcl_stream.peers.*",),
    ("bcl_stream.process_layout",),
    ("bcl_stream.text.*",),
    ("bcl_stream.records.source", "bcl_stream.records.kind"),
    ("bcl_stream.io.*",),
    ("bcl_stream.vision.*",),
    ("bcl_stream.epoch.*",),
    ("bcl_stream.formats.*", "bcl_stream.records.*"),
    ("bcl_stream.loading.*", "bcl_stream.vision.batch"),  # a collate: finds a record's images
    ("bcl_stream.training.*",),
    ("bcl_stream.preprocess.*",),
    ("bcl_stream.analysis.*",),
    ("bcl_stream",),
    ("bcl_stream.commands.*",),
    ("bcl_stream.cli",),
    ("lightning_module.*",),
    ("bcl_bench.*",),
)
"""Lowest first. ``pkg.*``: the package and every module under it; ``pkg.mod``: that module."""

ALLOWED_DEFERRALS: Mapping[tuple[str, str], str] = {}
"""(importing module, imported module) -> why a light module is imported inside a function."""


@dataclass(frozen=True, slots=True)
class Import:
    """One first-party import: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    deferred: bool
    """Inside a function (runs when called, not at import)."""
    type_only: bool = False
    """Under ``if TYPE_CHECKING:`` (never runs; seen by type checkers)."""


@dataclass(frozen=True, slots=True)
class Graph:
    files: dict[str, Path]
    """Module name -> its file."""
    imports: list[Import]
    heavy: dict[str, frozenset[str]]
    """Module -> the heavy libraries its own module-level imports name."""


def module_files(root: Path, packages: Sequence[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` by dotted name (a package is its ``__init__``)."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _walk(
    node: ast.AST, deferred: bool = False, type_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Import statements under ``node`` with whether they run inside a function and whether
    they sit under ``if TYPE_CHECKING:`` (they never run, but type checkers follow them)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, deferred, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for inner in child.body:
                yield from _walk(ast.Module(body=[inner], type_ignores=[]), deferred, True)
            for other in child.orelse:
                yield from _walk(ast.Module(body=[other], type_ignores=[]), deferred, type_only)
        else:
            inner_fn = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _walk(child, deferred or inner_fn, type_only)


def _resolve(name: str, files: Mapping[str, Path]) -> str | None:
    """The first-party module ``name`` (a module, or a name inside one) refers to."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def read_graph(root: Path, packages: Sequence[str]) -> Graph:
    files = module_files(root, packages)
    imports: list[Import] = []
    heavy: dict[str, frozenset[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        own_heavy: set[str] = set()
        for node, deferred, type_only in _walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
                names = [n if _resolve(n, files) == n else base for n in names]
            for name in names:
                top = name.split(".")[0]
                if top in HEAVY and not deferred and not type_only:
                    own_heavy.add(top)
                if top not in packages:
                    continue
                target = _resolve(name, files)
                found = Import(module, target or "", node.lineno, deferred, type_only)
                if target is not None and target != module and found not in imports:
                    imports.append(found)
        heavy[module] = frozenset(own_heavy)
    return Graph(files, imports, heavy)


def _parents(module: str, files: Mapping[str, Path]) -> Iterator[str]:
    parts = module.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent in files:
            yield parent


def reach(graph: Graph) -> dict[str, frozenset[str]]:
    """Module -> every first-party module importing it runs (module-level imports and the
    packages' ``__init__`` on the way, transitively; itself included)."""
    edges: dict[str, set[str]] = {m: set(_parents(m, graph.files)) for m in graph.files}
    for imp in graph.imports:
        if not imp.deferred and not imp.type_only:
            edges[imp.source].add(imp.target)
            edges[imp.source].update(_parents(imp.target, graph.files))
    found: dict[str, frozenset[str]] = {}
    for module in graph.files:
        seen, todo = {module}, [module]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        found[module] = frozenset(seen)
    return found


def heavy_closure(graph: Graph, reached: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Module -> every heavy library importing it loads."""
    return {m: frozenset().union(*(graph.heavy[r] for r in reached[m])) for m in graph.files}


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected groups of more than one module in the module-level graph (each a
    circle or several), each sorted."""
    edges: dict[str, set[str]] = {m: set() for m in graph.files}
    for imp in graph.imports:
        if not imp.deferred:
            edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is ~200 modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph.files):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, level): the most specific entry wins
    for level, entries in enumerate(layers):
        for entry in entries:
            prefix = entry.removesuffix(".*")
            wide = entry.endswith(".*")
            matches = module == prefix or (wide and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), level)
    return None if best is None else best[1]


def violations(
    root: Path,
    packages: Sequence[str] = PACKAGES,
    layers: Sequence[Sequence[str]] = LAYERS,
    allowed: Mapping[tuple[str, str], str] = ALLOWED_DEFERRALS,
) -> dict[str, list[str]]:
    """Every broken rule, by file relative to ``root``: ``"LINE: RULE: what"`` lines."""
    graph = read_graph(root, packages)
    reached = reach(graph)
    closure = heavy_closure(graph, reached)
    found: dict[str, list[str]] = {}

    def report(module: str, line: int, rule: str, text: str) -> None:
        name = graph.files[module].relative_to(root).as_posix()
        found.setdefault(name, []).append(f"{line}: {rule}: {text}")

    for module in graph.files:
        if layer_of(module, layers) is None:
            report(module, 1, "layer", f"{module} is in no layer: add its package to LAYERS")
    for group in cycles(graph):
        members = set(group)
        for imp in graph.imports:
            if not imp.deferred and imp.source in members and imp.target in members:
                report(
                    imp.source,
                    imp.line,
                    "cycle",
                    f"imports {imp.target}, in the circle {' <-> '.join(group)}",
                )
    for imp in graph.imports:
        source, target = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if source is not None and target is not None and target > source:
            where = (
                "under TYPE_CHECKING"
                if imp.type_only
                else "inside a function"
                if imp.deferred
                else "at module level"
            )
            report(
                imp.source,
                imp.line,
                "upward",
                f"{imp.source} imports {imp.target} {where}, a higher layer",
            )
        if imp.deferred and not imp.type_only and imp.source in reached[imp.target]:
            report(
                imp.source,
                imp.line,
                "cycle",
                f"imports {imp.target} inside a function, and {imp.target} imports "
                f"{imp.source} back at module level: a circle the function hides",
            )
        if imp.deferred and not imp.type_only and (imp.source, imp.target) not in allowed:
            deferred = closure[imp.target] - closure[imp.source]
            if not deferred:
                already = sorted(closure[imp.source] & closure[imp.target])
                why = (
                    f"whose heavy libraries ({', '.join(already)}) the module imports anyway"
                    if already
                    else "which imports no heavy library"
                )
                report(
                    imp.source,
                    imp.line,
                    "deferral",
                    f"{imp.target} is imported inside a function, {why}: import it at the top",
                )
    return found


def _lines(found: Mapping[str, Iterable[str]]) -> str:
    return "\n".join(f"{name}:{line}" for name, lines in sorted(found.items()) for line in lines)


def test_the_tree_keeps_its_layers() -> None:
    found = violations(ROOT)
    assert not found, "import rules broken (see this module's docstring):\n" + _lines(found)


def test_allowed_deferrals_are_still_imports() -> None:
    graph = read_graph(ROOT, PACKAGES)
    present = {(i.source, i.target) for i in graph.imports if i.deferred}
    assert set(ALLOWED_DEFERRALS) <= present, sorted(set(ALLOWED_DEFERRALS) - present)


# -- the checker on a planted package ------------------------------------------------------

PLANTED = {
    "pkg/__init__.py": "",
    "pkg/low/__init__.py": "",
    "pkg/low/a.py": "from pkg.low.b import B\nA = 1\n",
    "pkg/low/b.py": "from pkg.low import a\nB = 2\n",
    "pkg/low/light.py": "import json\nX = 1\n",
    "pkg/low/heavy.py": "import torch\nY = 1\n",
    "pkg/low/uses.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.high.top import T\n"
        "def light():\n"
        "    from pkg.low.light import X\n"
        "    return X\n"
        "def heavy():\n"
        "    from pkg.low.heavy import Y\n"
        "    return Y\n"
    ),
    "pkg/low/already.py": (
        "import torch\ndef again():\n    from pkg.low.heavy import Y\n    return Y\n"
    ),
    "pkg/low/up.py": "from pkg.high.top import T\n",
    "pkg/high/__init__.py": "",
    "pkg/high/top.py": "from pkg.low.light import X\nT = X\n",
    "pkg/stray.py": "",
    "pkg/high/host.py": "import torch\nfrom pkg.high.mixin import M\n",
    "pkg/high/mixin.py": "def host():\n    from pkg.high.host import torch\n    return torch\n",
    "pkg/high/typed.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high.hint import H\n"
    ),
    "pkg/high/hint.py": "from pkg.high.typed import TYPE_CHECKING\nH = 1\n",
}
PLANTED_LAYERS = (("pkg",), ("pkg.low.*",), ("pkg.high.*",))


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, list[str]]:
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return violations(tmp_path, ("pkg",), PLANTED_LAYERS, {})


def rules(found: Mapping[str, list[str]], name: str) -> list[str]:
    return [line.split(": ")[1] for line in found.get(name, [])]


def test_checker_refuses_a_cycle_and_names_it(planted: dict[str, list[str]]) -> None:
    assert rules(planted, "pkg/low/a.py") == ["cycle"]
    assert rules(planted, "pkg/low/b.py") == ["cycle"]
    assert "pkg.low.a <-> pkg.low.b" in planted["pkg/low/a.py"][0]


def test_checker_refuses_a_type_only_circle(planted: dict[str, list[str]]) -> None:
    # typed imports hint only for type checkers, hint imports typed at run time: still a circle
    assert rules(planted, "pkg/high/typed.py") == ["cycle"]
    assert rules(planted, "pkg/high/hint.py") == ["cycle"]
    assert "pkg.high.hint <-> pkg.high.typed" in planted["pkg/high/typed.py"][0]


def test_checker_refuses_a_circle_hidden_in_a_function(planted: dict[str, list[str]]) -> None:
    # mixin defers torch by importing host late, but host imports mixin at module level
    assert rules(planted, "pkg/high/mixin.py") == ["cycle"]
    assert "a circle the function hides" in planted["pkg/high/mixin.py"][0]
    assert "pkg/high/host.py" not in planted


def test_checker_refuses_a_light_import_inside_a_function(planted: dict[str, list[str]]) -> None:
    # the heavy deferral (pkg.low.heavy imports torch) passes, the light one does not; the
    # TYPE_CHECKING import of a higher layer is an upward arrow like any other
    assert planted["pkg/low/uses.py"] == [
        "3: upward: pkg.low.uses imports pkg.high.top under TYPE_CHECKING, a higher layer",
        "5: deferral: pkg.low.light is imported inside a function, which imports no heavy "
        "library: import it at the top",
    ]


def test_checker_refuses_a_deferral_that_defers_nothing(planted: dict[str, list[str]]) -> None:
    assert rules(planted, "pkg/low/already.py") == ["deferral"]
    assert "(torch) the module imports anyway" in planted["pkg/low/already.py"][0]


def test_checker_refuses_an_upward_arrow(planted: dict[str, list[str]]) -> None:
    assert rules(planted, "pkg/low/up.py") == ["upward"]
    assert "pkg/high/top.py" not in planted  # downward is fine


def test_checker_refuses_a_module_in_no_layer(planted: dict[str, list[str]]) -> None:
    assert rules(planted, "pkg/stray.py") == ["layer"]


def test_checker_takes_an_allowlisted_deferral(tmp_path: Path) -> None:
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    allowed = {("pkg.low.uses", "pkg.low.light"): "a planted reason"}
    found = violations(tmp_path, ("pkg",), PLANTED_LAYERS, allowed)
    assert rules(found, "pkg/low/uses.py") == ["upward"]  # the deferral is allowed
