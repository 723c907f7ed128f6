"""One writer per output: ``preprocess`` and ``annotate`` refuse to write where another live
process is writing.

Why: two runs pointed at the same ``--output`` interleave their shards and race to write the
index; the survivor's ``bcl_index.json`` then describes shards the other run rewrote. Nothing
failed loudly before: the dataset just read wrong.

How: an exclusive, non-blocking ``fcntl.flock`` on a lock file beside the output
(``<parent>/.<name>.bcl-write.lock``; beside, not inside, because ``--overwrite`` deletes the
output directory). The kernel drops a flock when its holder dies, SIGKILL included, so a killed
writer never blocks the next run and there is no staleness guess to get wrong (pid reuse, clock
skew). The file holds the holder's pid, host, command and start time: a refused run names them,
and a run that takes over from a killed holder says whose lock it was. The holder deletes the
file when it finishes (after checking, under the lock, that the path is still its file).

Limits: remote outputs (``s3://``) are locked on this machine only (a lock file in the temp
directory keyed by the URL); two machines writing one bucket prefix are not detected. On NFS,
flock works across clients on Linux (it is emulated with POSIX locks) but not on every server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from bcl_stream.errors import DatasetError
from bcl_stream.io.remote import is_remote

LOCK_SUFFIX = ".bcl-write.lock"
P = ParamSpec("P")
R = TypeVar("R")


def lock_path(output: str | os.PathLike[str]) -> Path:
    """Where the lock for ``output`` lives (see the module docstring)."""
    text = str(output)
    if is_remote(text):
        key = hashlib.sha256(text.rstrip("/").encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / "bcl-stream-locks" / f"{key}{LOCK_SUFFIX}"
    root = Path(text.removeprefix("file://")).absolute()
    return root.parent / f".{root.name}{LOCK_SUFFIX}"


def _holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 65536).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that left no details"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('what')}, started {when})"


@contextmanager
def output_lock(output: str | os.PathLike[str], what: str) -> Iterator[Path]:
    """Hold the write lock of ``output`` for the block, or raise :class:`DatasetError` at once
    if a live process holds it. Output: the lock file's path."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = _holder(fd)
            os.close(fd)
            raise DatasetError(
                f"output {output} is being written by {_describe(holder)}: two writers would "
                "mix their shards and indexes. Wait for that run to finish or stop it, then run "
                f"again (lock file {path}; a killed writer's lock is released automatically)."
            ) from exc
        try:  # the holder we waited on may have deleted the file between our open and flock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        previous = _holder(fd)
        if previous:
            warnings.warn(
                f"{output}: taking over the write lock of {_describe(previous)}, which ended "
                "without releasing it (killed?); what it wrote is incomplete and is replaced "
                "or refused as such.",
                UserWarning,
                stacklevel=3,
            )
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "what": what,
            "command": " ".join(sys.argv)[:500],
            "started": time.time(),
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still ours: nobody else can hold it, and we checked the inode
        os.close(fd)
