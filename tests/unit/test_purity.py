"""The planner stays pure: ``bcl_stream/planner/`` imports numpy, the standard library and
itself only (plus ``bcl_stream.errors`` for its error types), and reads or writes no file. The
peers' reproductions (``bcl_stream/peers/``) obey the same rule and may also import the
planner; the planner never imports them.

Checked on the syntax tree (every ``import`` and call, at the top or inside a function), so a
name in a docstring or a comment neither trips nor hides anything; the checker is run on a
copy of the package with a planted offence to show it catches each kind.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bcl_stream"
PLANNER = PACKAGE / "planner"
PEERS = PACKAGE / "peers"
OWN = ("bcl_stream.planner", "bcl_stream.errors")
"""What the planner may import of this project."""
PEERS_OWN = (*OWN, "bcl_stream.peers")
"""What the peers may import of this project: the planner below them, never the reverse."""
IO_MODULES = {"os", "io", "pathlib", "shutil", "subprocess", "socket", "tempfile", "pickle"}
IO_MODULES |= {"urllib", "http", "mmap", "glob", "fileinput", "sqlite3"}
IO_CALLS = {"open", "load", "save", "savez", "savez_compressed", "fromfile", "tofile", "memmap"}
IO_CALLS |= {"loadtxt", "savetxt", "genfromtxt"}


def allowed(module: str, own: tuple[str, ...] = OWN) -> bool:
    root = module.split(".")[0]
    if root == "bcl_stream":
        return any(module == o or module.startswith(o + ".") for o in own)
    if root in IO_MODULES:
        return False
    return root == "numpy" or root in sys.stdlib_module_names or root == "__future__"


def offences(package: Path, own: tuple[str, ...] = OWN) -> list[str]:
    """``file:line: what`` for every import outside numpy/stdlib/own and every file access."""
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                modules = []
            found += [f"{where}:{node.lineno}: imports {m}" for m in modules if not allowed(m, own)]
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name in IO_CALLS:
                    found.append(f"{where}:{node.lineno}: calls {name}()")
    return found


def test_planner_imports_only_numpy_and_the_standard_library() -> None:
    modules = sorted(PLANNER.rglob("*.py"))
    assert {"node_streams.py", "windows.py", "bcl.py"} <= {p.name for p in modules}
    assert offences(PLANNER) == []


def test_peers_import_only_numpy_the_standard_library_and_the_planner() -> None:
    modules = {p.name for p in PEERS.rglob("*.py")}
    assert {"__init__.py", "nemo.py", "verl.py", "hf.py", "mffd.py", "pools.py"} <= modules
    assert offences(PEERS, PEERS_OWN) == []


@pytest.mark.parametrize(
    ("line", "caught"),
    [
        ("import torch", "imports torch"),
        ("from streaming.base import util", "imports streaming.base"),
        ("from bcl_stream.io import index", "imports bcl_stream.io"),
        ("import os.path", "imports os.path"),
        ("from pathlib import Path", "imports pathlib"),
        ("def f():\n    import webdataset", "imports webdataset"),
        ("def f(p):\n    return open(p).read()", "calls open()"),
        ("def f(p):\n    return np.load(p)", "calls load()"),
        ("from bcl_stream.peers import PEERS", "imports bcl_stream.peers"),
        ("import bcl_stream.peers.nemo", "imports bcl_stream.peers.nemo"),
        ("from bcl_stream.planner_extra import x", "imports bcl_stream.planner_extra"),
    ],
    ids=[
        "torch",
        "streaming",
        "bcl_stream.io",
        "os",
        "pathlib",
        "nested",
        "open",
        "np.load",
        "peers",
        "peers-module",
        "prefix-lookalike",
    ],
)
def test_the_check_catches_a_planted_offence(tmp_path: Path, line: str, caught: str) -> None:
    copy = tmp_path / "planner"
    shutil.copytree(PLANNER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "windows.py"
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    (got,) = offences(copy)
    assert got.startswith("windows.py:") and got.endswith(caught), got


@pytest.mark.parametrize(
    ("line", "caught"),
    [
        ("import torch", "imports torch"),
        ("from bcl_stream.io import index", "imports bcl_stream.io"),
        ("from bcl_stream.analysis import sim", "imports bcl_stream.analysis"),
        ("def f(p):\n    return open(p).read()", "calls open()"),
    ],
    ids=["torch", "bcl_stream.io", "analysis", "open"],
)
def test_the_check_catches_a_planted_offence_in_the_peers(
    tmp_path: Path, line: str, caught: str
) -> None:
    copy = tmp_path / "peers"
    shutil.copytree(PEERS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "nemo.py"
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    (got,) = offences(copy, PEERS_OWN)
    assert got.startswith("nemo.py:") and got.endswith(caught), got


def test_planner_import_loads_no_torch_or_io_library() -> None:
    """At run time too: importing the planner, the peers, the cost model and the simulator pulls
    in none of the heavy or I/O libraries (``import streaming`` alone takes seconds)."""
    code = (
        "import sys, bcl_stream.planner, bcl_stream.peers, bcl_stream.cost;"
        "import bcl_stream.analysis.sim;"
        "bad = [m for m in ('torch', 'streaming', 'webdataset', 'lightning', 'boto3', 'tiktoken') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
