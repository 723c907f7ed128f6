"""Names that come with the data, checked before any path is built from them.

Why: a dataset's indexes name its files. ``index.json`` (MDS) and ``bcl_index.json`` name the
shards, a tar names its members, and nothing ties those names to the dataset they describe: the
seal of ``bcl_index.json`` is a self-hash that whoever edits the file can recompute. A shard
named ``../../x/planted.sh`` used to be downloaded to a path outside the cache, and read from
outside the dataset directory; an absolute name was written at that path. A file planted that
way in ``site-packages``, ``~/.ssh`` or a cron directory runs code on every node.

So every such name goes through :func:`check_name` where it is parsed (the index readers, the
tar scanner), and every path built from one goes through :func:`path_under`, which checks the
name again and that the path stays under the dataset or cache root. Nothing is downloaded,
read or written for a name that fails.

The rules, per kind of name:

- ``shard``: a relative POSIX path. Subdirectories are allowed because stock tools write them
  (streaming's ``merge_index`` names ``part/shard.00000.mds``, ``bcl-stream merge`` names
  ``part-I-of-N/shard-000000.tar``); refused: an empty name, an absolute name (``/x``), a
  Windows drive or separator (``C:``, ``\\``), a NUL byte, and empty, ``.`` or ``..`` components.
- ``member``: a tar member name. WebDataset keys keep their directories and ``tar`` writes
  ``./name`` for files given as ``./name``, so separators and ``.`` are allowed; refused: an
  empty name, an absolute name, a NUL byte and ``..`` components. Member names never become
  paths here; a member that would climb out of its shard is hostile all the same.

Symbolic links: a path is checked as written (``os.path.normpath``), except that a directory a
download is written into is resolved (``os.path.realpath``) and must lie under the resolved
cache root. A local dataset directory is the user's own: a shard file or part directory there
that is a symlink is the owner's choice (datasets assembled with ``ln -s``), not something a
name from the data can create.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from bcl_stream.errors import UnsafeNameError

NameKind = Literal["shard", "member"]

MAX_NAME = 4096
"""Longest name accepted (Linux's PATH_MAX): a longer one is no file name any store writes."""


def name_problem(name: object, kind: NameKind = "shard") -> str | None:
    """What is wrong with ``name`` as a name of ``kind`` (see the module docstring), or None."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long (at most {MAX_NAME})"
    if "\0" in name:
        return "holds a NUL byte"
    if name.startswith("/"):
        return "is absolute"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out of its directory ('..')"
    if kind == "member":
        return None
    if "\\" in name or (len(name) > 1 and name[1] == ":"):
        return "holds a Windows separator or drive ('\\' or 'X:')"
    if "" in parts or "." in parts:
        return "has an empty or '.' path component"
    return None


def check_name(name: object, kind: NameKind, where: str) -> str:
    """``name`` itself when it is a safe name of ``kind``; else :class:`UnsafeNameError`.

    ``where`` names the entry and the dataset, e.g. ``"s3://b/ds: index.json shard 3"``.
    """
    problem = name_problem(name, kind)
    if problem is not None:
        raise unsafe(name, problem, where)
    assert isinstance(name, str)
    return name


def unsafe(name: object, problem: str, where: str) -> UnsafeNameError:
    """The one error for a name that fails :func:`name_problem`."""
    return UnsafeNameError(
        f"{where}: name {str(name)[:200]!r} {problem}. A name that comes with the data must be "
        "a relative path inside the dataset (no absolute path, no '..'); nothing was read or "
        "written for it. The index was written by another tool or edited: rebuild it with "
        "`bcl-stream annotate --overwrite` (or re-run preprocess), or ask whoever supplies the "
        "dataset."
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def path_under(
    root: str | os.PathLike[str], name: str, where: str, *, writing: bool = False
) -> Path:
    """``root / name`` after checking ``name`` (a shard name) and that the path stays under
    ``root``. ``writing``: the path is about to be written (a download, a lock file, a member
    index), so the directory it goes into is resolved through symbolic links too and must lie
    under the resolved ``root``. Raises :class:`UnsafeNameError` naming ``where``."""
    check_name(name, "shard", where)
    base = os.path.normpath(os.fspath(root))
    path = os.path.normpath(os.path.join(base, name))
    if not _inside(path, base):
        raise unsafe(name, f"resolves to {path}, outside {base}", where)
    if writing:
        real_base = os.path.realpath(base)
        real_dir = os.path.realpath(os.path.dirname(path))
        if not _inside(real_dir, real_base):
            raise unsafe(name, f"resolves to {real_dir}, outside {real_base}", where)
    return Path(path)
