"""Real corpora built offline from this machine's own files, each in its write order.

The balance benchmarks need real length distributions in the order a writer would store them
(grouped by source, sorted by name), not i.i.d. draws: ordered data is what breaks planners.
Every corpus here is a pure function of files that ship with the operating system or the
Python environment, tokenized with the offline cl100k encoding, and cached as ``.npy``
(keyed by the file list and sizes, so a changed machine rebuilds it):

- ``man``: every English manual page (``/usr/share/man/man[1-8]``), one record per page, in
  path order (section by section, then by name).
- ``changelogs``: every package changelog under ``/usr/share/doc``, one record per file: long
  documents, capped at the record limit like any writer would.
- ``code:<package>``: every function of one installed package, in path then source order
  (``corpora.sitepackages_lengths`` on that package's directory).
- ``docstrings:sympy``: every docstring of sympy's functions (formulas and doctests: the
  nearest thing to math text on this machine).
- ``stdlib_chat``: the standard library's documented functions as chat records (user: the
  docstring, assistant: the source; ``corpora.stdlib_lengths``).

Derived corpora (``sorted:*``, ``mix:*``) are built by :func:`build` from these.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import sysconfig
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_bench.corpora import (
    CACHE_DIR,
    TOKENIZERS,
    _functions,
    sitepackages_lengths,
    stdlib_lengths,
)

Lengths = npt.NDArray[np.int64]
MAN_ROOT = Path("/usr/share/man")
DOC_ROOT = Path("/usr/share/doc")


def _cached(name: str, files: list[Path], texts: Callable[[], Iterator[str]]) -> Lengths:
    """Token counts of ``texts()`` (cl100k), cached under a key of the file list and sizes."""
    digest = hashlib.sha256(name.encode())
    for path in files:
        digest.update(f"{path}:{path.stat().st_size};".encode())
    cache = CACHE_DIR / f"{name}_cl100k_{digest.hexdigest()[:12]}.npy"
    if cache.exists():
        return np.load(cache, allow_pickle=False).astype(np.int64)
    import tiktoken

    encoding = tiktoken.get_encoding(TOKENIZERS["cl100k"])
    counts: list[int] = []
    batch: list[str] = []
    for text in texts():
        batch.append(text)
        if len(batch) == 512:
            counts.extend(len(t) for t in encoding.encode_ordinary_batch(batch, num_threads=2))
            batch = []
    counts.extend(len(t) for t in encoding.encode_ordinary_batch(batch, num_threads=2))
    lengths = np.asarray(counts, dtype=np.int64)
    if lengths.size == 0:
        raise FileNotFoundError(f"corpus {name}: no files found to build it from")
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, lengths)
    return lengths


def _read_gz(path: Path) -> str | None:
    """A gzip-compressed (or plain) text file, or None if it does not read (reported by the
    caller's count of records: a page that does not decompress is not a record)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    return raw.decode("utf-8", errors="replace")


def _texts(files: list[Path]) -> Callable[[], Iterator[str]]:
    def gen() -> Iterator[str]:
        for path in files:
            text = _read_gz(path)
            if text is not None and text.strip():
                yield text

    return gen


def man_lengths() -> Lengths:
    """Tokens of every English manual page, in path order."""
    files = sorted(p for s in range(1, 9) for p in (MAN_ROOT / f"man{s}").glob("*") if p.is_file())
    return _cached("man", files, _texts(files))


def changelog_lengths() -> Lengths:
    """Tokens of every package changelog under /usr/share/doc, in path order."""
    files = sorted(p for p in DOC_ROOT.glob("*/changelog*") if p.is_file())
    return _cached("changelogs", files, _texts(files))


def docstring_lengths(package: str) -> Lengths:
    """Tokens of every function docstring of an installed package, in path then source order."""
    base = Path(sysconfig.get_paths()["purelib"]) / package
    files = sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)

    def gen() -> Iterator[str]:
        for path in files:
            try:
                with tokenize.open(path) as fh:
                    tree = ast.parse(fh.read(), filename=str(path))
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
                continue
            for _, node in _functions(tree):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    yield doc

    return _cached(f"docstrings_{package}", files, gen)


def package_code_lengths(package: str) -> Lengths:
    """Tokens of every function of one installed package (path then source order)."""
    return sitepackages_lengths(Path(sysconfig.get_paths()["purelib"]) / package)


BASE: dict[str, Callable[[], Lengths]] = {
    "man": man_lengths,
    "changelogs": changelog_lengths,
    "code:torch": lambda: package_code_lengths("torch"),
    "code:transformers": lambda: package_code_lengths("transformers"),
    "code:networkx": lambda: package_code_lengths("networkx"),
    "docstrings:sympy": lambda: docstring_lengths("sympy"),
    "stdlib_chat": lambda: stdlib_lengths("cl100k"),
}
"""The real corpora, as written."""
MIXTURES: dict[str, tuple[str, ...]] = {
    "mix:man+torch+changelogs": ("man", "code:torch", "changelogs"),
    "mix:chat+sympy+transformers": ("stdlib_chat", "docstrings:sympy", "code:transformers"),
}
"""Mixtures written source by source (each source's records, then the next source's), with
equal shares of the records."""
SORTED = ("sorted:man",)
"""Length-sorted corpora (a writer that sorted by length)."""
TUNE = ("man", "code:torch", "docstrings:sympy", "mix:man+torch+changelogs", "sorted:man")
"""The corpora the defaults are chosen on."""
HELD_OUT = ("changelogs", "code:transformers", "code:networkx", "stdlib_chat",
            "mix:chat+sympy+transformers")  # fmt: skip
"""The corpora kept out of every choice: the targets are read on these."""
NAMES = TUNE + HELD_OUT


def corpus_sets(rows: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A benchmark's result rows (each with ``held_out``) as ``("tune", rows)`` then
    ``("held_out", rows)``, a set without rows left out: the figures are read apart on each."""
    for part, held in (("tune", False), ("held_out", True)):
        sub = [r for r in rows if r["held_out"] == held]
        if sub:
            yield part, sub


def build(name: str, n: int, cap: int) -> Lengths:
    """``n`` lengths of corpus ``name`` in write order, each capped at ``cap`` tokens: a base
    corpus repeated end to end (its order kept), a mixture's sources one after the other (each
    repeated to its share), or a base corpus sorted by length."""
    if name in BASE:
        return np.resize(np.minimum(BASE[name](), cap), n).astype(np.int64)
    if name in MIXTURES:
        parts = MIXTURES[name]
        shares = [n // len(parts) + (i < n % len(parts)) for i in range(len(parts))]
        return np.concatenate([build(p, k, cap) for p, k in zip(parts, shares, strict=True)])
    if name.startswith("sorted:") and name[len("sorted:") :] in BASE:
        return np.sort(build(name[len("sorted:") :], n, cap))
    raise ValueError(f"unknown corpus {name!r}; choose one of {NAMES}")
