"""Token counts straight from raw MDS shards, without importing Mosaic Streaming.

Why: ``bcl-stream annotate`` needs one number per record (the length of the token column, or
an integer length column), and importing streaming costs 4-8 s (it imports transformers and
torch), far more than reading the shards of a small dataset. For the column encodings that
hold such a number in a fixed place, the count is read from the bytes directly, vectorised
over all samples of a shard; anything else (other encodings, compressed-only shards) returns
None and the caller decodes with streaming's own reader.

The MDS layout read here (re-implemented from the format as mosaicml-streaming 0.13.0 writes
and reads it: ``streaming/base/format/mds/reader.py`` ``get_sample_data``/``decode_sample``
and ``mds/encodings.py`` ``NDArray``, tag v0.13.0):

- shard file: ``uint32 n``, then ``n + 1`` uint32 absolute byte offsets; sample ``i`` is
  ``[offset[i], offset[i+1])``;
- sample: a uint32 byte size for every column whose size is not fixed (``column_sizes`` entry
  null), in column order, then the columns' bytes in column order;
- ``ndarray[:dtype[:shape]]``: optional dtype byte (when no dtype is given), then, when no
  shape is given, one byte ``ndim << 2 | k`` and ``ndim`` shape values of ``2**k`` bytes each,
  then the values: the element count is (column bytes - header) / item size;
- integer scalars (``int`` = int64, ``uint8`` ... ``int64``): the value, native byte order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

_VALUE_DTYPES = {
    8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
    33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64",
}  # fmt: skip
"""NDArray's dtype byte -> dtype (streaming's ``_int2value_dtype``)."""
_INT_SCALARS = {
    "int": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
}  # fmt: skip


def _u32_at(buf: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Little-endian uint32 read at each byte position ``pos``."""
    out = np.zeros(pos.shape, dtype=np.int64)
    for k in range(4):
        out |= buf[pos + k].astype(np.int64) << (8 * k)
    return out


def _spans(
    path: Path, shard: dict[str, Any], field: str
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64], str] | None:
    """(shard bytes, start of ``field`` in each sample, its byte size in each sample, its
    encoding), or None when the shard cannot be read this way (the caller decodes)."""
    names = list(shard.get("column_names") or [])
    encodings = list(shard.get("column_encodings") or [])
    sizes = list(shard.get("column_sizes") or [])
    if field not in names or not path.is_file() or not len(names) == len(encodings) == len(sizes):
        return None
    col = names.index(field)
    buf = np.fromfile(path, dtype=np.uint8)
    n = int(_u32_at(buf, np.zeros(1, np.int64))[0])
    if n != int(shard.get("samples", -1)) or buf.size < 4 * (n + 2):
        return None
    offsets = _u32_at(buf, 4 * (1 + np.arange(n + 1, dtype=np.int64)))
    starts = offsets[:-1]
    variable = [j for j, size in enumerate(sizes) if not size]
    width: dict[int, npt.NDArray[np.int64]] = {}
    for k, j in enumerate(variable):
        width[j] = _u32_at(buf, starts + 4 * k)
    begin = starts + 4 * len(variable)
    for j in range(col):
        begin = begin + (width[j] if j in width else int(sizes[j]))
    nbytes = width[col] if col in width else np.full(n, int(sizes[col]), np.int64)
    if n and (int((begin + nbytes).max()) > buf.size or int(nbytes.min()) < 0):
        return None
    return buf, begin, nbytes, str(encodings[col])


def column_bytes(path: Path, shard: dict[str, Any], field: str) -> list[bytes] | None:
    """Each sample's raw bytes of a ``str`` or ``bytes`` column (a ``str`` is its UTF-8), or
    None when this fast path does not apply."""
    spans = _spans(path, shard, field)
    if spans is None or spans[3] not in ("str", "bytes"):
        return None
    buf, begin, nbytes, _ = spans
    data = buf.tobytes()
    return [data[b : b + w] for b, w in zip(begin.tolist(), nbytes.tolist(), strict=True)]


def _ids_out_of_range(
    buf: npt.NDArray[np.uint8],
    begin: npt.NDArray[np.int64],
    nbytes: npt.NDArray[np.int64],
    dtype: np.dtype[Any],
) -> bool:
    """Whether some raw id of the column lies outside ``[0, 2**32)`` (only a signed or wider
    dtype can hold one): one gather of the column's bytes, no decoding."""
    if not nbytes.size or (dtype.kind == "u" and dtype.itemsize <= 4):
        return False
    total = int(nbytes.sum())
    if not total:
        return False
    first = np.cumsum(nbytes) - nbytes  # where each sample's bytes start in the gather
    idx = np.repeat(begin - first, nbytes) + np.arange(total, dtype=np.int64)
    ids = buf[idx].view(dtype)
    return bool(int(ids.min()) < 0 or int(ids.max()) >= 2**32)


def shard_counts(
    path: Path, shard: dict[str, Any], field: str, as_length: bool, raw_dtype: str | None = None
) -> list[int] | None:
    """Per-sample counts of ``field`` in one raw shard file, or None when this fast path does
    not apply (the caller then decodes with streaming). ``as_length``: ``field`` is an integer
    length column; else its element count is the record's token count: an integer
    ``ndarray`` column, or a ``bytes`` column of ``raw_dtype`` values. Float arrays are not
    counted here (the decoding path refuses them by name)."""
    spans = _spans(path, shard, field)
    if spans is None:
        return None
    buf, begin, nbytes, encoding = spans
    parts = encoding.split(":")
    n = begin.size
    if as_length:
        if encoding not in _INT_SCALARS:
            return None
        dtype = np.dtype(_INT_SCALARS[encoding])
        idx = begin[:, None] + np.arange(dtype.itemsize)
        values = buf[idx].copy().view(dtype).reshape(-1)
        if values.size and int(values.min()) < 0:
            return None  # the decoding path names the bad sample
        return [int(v) for v in values]
    if encoding == "bytes" and raw_dtype is not None:
        size = np.dtype(raw_dtype).itemsize
        if (nbytes % size).any():
            return None  # the decoding path names the record
        if _ids_out_of_range(buf, begin, nbytes, np.dtype(raw_dtype)):
            return None  # the decoding path names the record and the id
        return [int(c) for c in nbytes // size]
    if parts[0] != "ndarray":
        return None
    if len(parts) > 1 and parts[1] and not np.issubdtype(np.dtype(parts[1]), np.integer):
        return None
    if len(parts) > 2:  # static shape: the same count for every record
        count = int(np.prod([int(d) for d in parts[2].split(",")]))
        return [count] * n
    header = np.zeros(n, dtype=np.int64)
    if len(parts) > 1 and parts[1]:
        itemsize = np.full(n, np.dtype(parts[1]).itemsize, dtype=np.int64)
    else:
        codes = buf[begin]
        integer = [code for code, name in _VALUE_DTYPES.items() if "int" in name]
        if not np.isin(codes, integer).all():
            return None
        table = np.zeros(256, dtype=np.int64)
        for code, name in _VALUE_DTYPES.items():
            table[code] = np.dtype(name).itemsize
        itemsize = table[codes]
        header += 1
    shape_byte = buf[begin + header].astype(np.int64)
    header += 1 + (shape_byte >> 2) * (1 << (shape_byte & 3))
    counts = (nbytes - header) // itemsize
    if ((nbytes - header) % itemsize).any() or (counts < 0).any():
        return None
    return [int(c) for c in counts]
