"""``.npy`` member bytes: the one encoder and the one decoder of token arrays in tar shards.

The WebDataset writer stores each record's token ids as ``np.save`` bytes (what stock
``webdataset`` decodes for a ``.npy`` member); the reader and ``annotate`` decode them here.
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
import numpy.typing as npt

_NPY_HEADER = re.compile(
    r"\{'descr': '([<>|]?[a-z]\d+)', 'fortran_order': False, 'shape': \((\d+),\), \}\s*$"
)


def npy_bytes(arr: np.ndarray) -> bytes:
    """``np.save`` bytes (what stock ``webdataset`` decodes for a ``.npy`` member)."""
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def load_npy(data: bytes) -> npt.NDArray[Any]:
    """``np.load`` for ``.npy`` bytes, with a fast path for 1-D arrays (what writers store).

    ``np.load`` parses the header with ``ast.literal_eval`` (a compile per record): about a
    third of the per-record decode cost in tools/bench_loader.py. Anything unusual falls back.
    """
    if data[:6] == b"\x93NUMPY" and data[6] == 1:
        end = 10 + int.from_bytes(data[8:10], "little")
        match = _NPY_HEADER.match(data[10:end].decode("latin1"))
        if match:
            dtype = np.dtype(match.group(1))
            count = int(match.group(2))
            if len(data) - end == count * dtype.itemsize:
                return np.frombuffer(data, dtype=dtype, count=count, offset=end).copy()
    return np.load(io.BytesIO(data), allow_pickle=False)
