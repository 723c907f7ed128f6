"""The cost array's file: its record dtypes and a read-only mapping of it.

Why mapped: every process of a node (ranks and their DataLoader workers) then shares one copy
of ``bcl_costs.npy`` through the page cache (see :mod:`bcl_stream.io.index`). The hash check
reads the file in ``HASH_CHUNK`` pieces with plain reads on the same open file, so it neither
copies the array nor maps its pages into the process.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.io.index_meta import fail as _fail

COST_DTYPE = np.dtype([("tokens", "<u4"), ("cost", "<f4"), ("trained", "<u4")])
"""The records of format 4 on."""
COST_DTYPE_V3 = np.dtype([("tokens", "<u4"), ("cost", "<f4")])
"""The records of formats 1-3 (no trained count), still read."""
RECORD_DTYPES = (COST_DTYPE, COST_DTYPE_V3)
HASH_CHUNK = 16 << 20
"""Bytes hashed per read: large enough that SHA-256 runs at full speed, small enough that the
check adds no visible memory."""


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Which file a mapped index came from, to re-map exactly that file in another process."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, fh: io.BufferedReader) -> FileIdentity:
        st = os.fstat(fh.fileno())
        return cls(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_header(npy: Path, fh: io.BufferedReader) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fh)
        raise ValueError(f".npy format version {version} is not supported")
    except Exception as exc:  # numpy parses the header with ast/tokenize: many error types
        raise _fail(npy, f"unreadable cost array ({exc})") from exc


def _hash_file(fh: io.BufferedReader, offset: int, nbytes: int) -> str:
    """SHA-256 of ``nbytes`` bytes from ``offset``, read in ``HASH_CHUNK`` pieces into one
    reused buffer (plain reads: the pages go to the page cache, not into this process)."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(min(HASH_CHUNK, max(nbytes, 1))))
    fh.seek(offset)
    remaining = nbytes
    while remaining:
        got = fh.readinto(buffer[: min(len(buffer), remaining)])
        if not got:
            break
        digest.update(buffer[:got])
        remaining -= got
    return digest.hexdigest()


def map_npy(npy: Path, *, verify: bool) -> tuple[npt.NDArray[np.void], FileIdentity, str | None]:
    """(read-only mapped records of either dtype, the file's identity, SHA-256 of the records
    if ``verify``)."""
    with open(npy, "rb") as fh:
        shape, fortran, dtype = _read_header(npy, fh)
        if dtype not in RECORD_DTYPES or len(shape) != 1 or fortran:
            raise _fail(
                npy, f"cost array has dtype {dtype} shape {shape}, expected 1-D {COST_DTYPE}"
            )
        offset, source = fh.tell(), FileIdentity.of(npy, fh)
        nbytes = shape[0] * dtype.itemsize
        if source.size < offset + nbytes:
            raise _fail(
                npy,
                f"truncated: {source.size} bytes on disk, the header needs {offset + nbytes}",
            )
        records: npt.NDArray[np.void]
        if shape[0]:
            mapped = np.memmap(fh, dtype=dtype, mode="r", offset=offset, shape=shape)
            # A plain ndarray view of the mapping (it keeps the map alive): np.memmap indexes
            # through a Python-level __getitem__, ~2 us per scalar lookup on the read path.
            records = mapped.view(np.ndarray)
        else:  # mmap cannot map zero bytes
            records = np.empty(0, dtype=dtype)
            records.flags.writeable = False
        digest = _hash_file(fh, offset, nbytes) if verify else None
    return records, source, digest
