"""WebDataset tar shards written with the standard library, without importing webdataset.

Why: ``import webdataset`` imports torch (3 s of CPU here, 12 s of wall-clock on a loaded
machine), which was most of what ``preprocess --format wds`` spent before its first record.
Writing a shard needs none of it: webdataset 1.0's ``TarWriter`` and ``ShardWriter``
(``webdataset/writer.py``) are a thin layer over :mod:`tarfile`, reproduced here exactly:

- a shard is ``tarfile.open(fileobj=<the file opened "wb">, mode="w|")`` (``"w|gz"`` for a
  name ending in ``gz``), in tarfile's default format (``TarWriter`` computes a ``format``
  but never passes it on);
- a sample's members are its keys in sorted order, ``__key__`` and keys starting with ``_``
  left out, each named ``<__key__>.<key>``, with ``mode`` 0o444, ``uname`` and ``gname``
  ``"bigdata"``, uid and gid 0, and ``mtime`` the float ``time.time()`` of that member (a
  float mtime is written in a PAX header, as webdataset's is);
- a new shard (``pattern % n``) starts before the sample that finds the open one holding
  ``maxcount`` samples or at least ``maxsize`` bytes of member data, and each shard closed
  is passed to ``post``.

Members are encoded as webdataset's default encoder encodes them: bytes as they are, a
string as UTF-8. Any other value (an array for ``.npy``, a dict for ``.json``, a ``.gz``
member) goes through webdataset's own encoder, imported then. ``tests/unit/test_wds_tar.py``
writes the same samples through both writers and compares the shards byte for byte.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from bcl_stream.io import streaming_compat

USER = GROUP = "bigdata"
"""``TarWriter``'s default ``user`` and ``group``."""
MODE = 0o444
"""``TarWriter``'s default member mode."""


def encode_members(sample: dict[str, Any]) -> dict[str, Any]:
    """``sample`` with every member as bytes, as ``webdataset.writer.make_encoder(True)``
    encodes it (``__key__`` and ``_`` metadata kept as given)."""
    if all(_plain(k, v) for k, v in sample.items()):
        return {k: v.encode("utf-8") if isinstance(v, str) and k[0] != "_" else v
                for k, v in sample.items()}  # fmt: skip
    encoded: dict[str, Any] = streaming_compat.wds_member_encoder()(sample)
    return encoded


def _plain(key: str, value: Any) -> bool:
    """Whether webdataset's encoder would leave ``value`` as is (bytes) or only UTF-8 encode
    it (a string): not metadata, not a ``.gz`` member."""
    if key == "__key__" or key[0] == "_":
        return isinstance(value, str)
    return isinstance(value, bytes | str) and not key.endswith(".gz")


class TarShards:
    """``webdataset.ShardWriter(pattern, maxcount, maxsize, post, encoder=False)`` writing
    already-encoded samples (dicts of bytes plus ``__key__``) to local files.

    ``mtime``: every member's modification time (None: ``time.time()`` as each member is
    written, webdataset's default).
    """

    def __init__(
        self,
        pattern: str,
        *,
        maxcount: int,
        maxsize: float,
        post: Callable[[str], None] | None = None,
        mtime: float | None = None,
    ) -> None:
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.mtime = mtime
        self.shard = 0
        self.count = 0
        self.size = 0
        self.fname: str | None = None
        self._file: BinaryIO | None = None
        self._tar: tarfile.TarFile | None = None
        self._next()  # ShardWriter opens its first shard on construction

    def _next(self) -> None:
        self._finish()
        self.fname = self.pattern % self.shard
        self.shard += 1
        self._file = open(self.fname, "wb")  # noqa: SIM115 (closed in _close)
        if self.fname.endswith("gz"):  # TarWriter.tarmode
            self._tar = tarfile.open(fileobj=self._file, mode="w|gz")  # noqa: SIM115
        else:
            self._tar = tarfile.open(fileobj=self._file, mode="w|")  # noqa: SIM115
        self.count = 0
        self.size = 0

    def write(self, sample: dict[str, Any]) -> None:
        """Write one encoded sample (``__key__`` and bytes members)."""
        if self._tar is None or self.count >= self.maxcount or self.size >= self.maxsize:
            self._next()
        assert self._tar is not None
        if "__key__" not in sample:
            raise ValueError("object must contain a __key__")
        for name, data in sample.items():
            if name[0] != "_" and not isinstance(data, bytes | bytearray | memoryview):
                raise ValueError(f"{name} doesn't map to a bytes after encoding ({type(data)})")
        key = sample["__key__"]
        total = 0
        for name in sorted(sample):
            if name[0] == "_":
                continue
            data = sample[name]
            info = tarfile.TarInfo(f"{key}.{name}")
            info.size = len(data)
            info.mtime = self.mtime if self.mtime is not None else time.time()
            info.mode = MODE
            info.uname = USER
            info.gname = GROUP
            self._tar.addfile(info, io.BytesIO(data))
            total += info.size
        self.count += 1
        self.size += total

    def _close(self) -> bool:
        """Close the open shard, if any; whether one was open."""
        if self._tar is None:
            return False
        self._tar.close()
        assert self._file is not None
        self._file.close()
        self._tar = self._file = None
        return True

    def _finish(self) -> None:
        if self._close() and self.post is not None:
            assert self.fname is not None
            self.post(self.fname)

    def close(self) -> None:
        """Close the last shard (``post`` runs on it)."""
        self._finish()

    def abort(self) -> None:
        """Close the open shard without running ``post`` (an incomplete output)."""
        self._close()
