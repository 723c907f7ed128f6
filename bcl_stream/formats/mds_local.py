"""MDS shards written to a local directory without importing streaming.

Why: ``import streaming`` imports torch and torchvision (7 s of CPU here), which is most of
what ``preprocess`` spent before its first record. The MDS format itself is small (streaming
0.13, ``format/mds/writer.py`` and ``format/base/writer.py``): a shard is ``[samples: uint32]
[offsets: uint32 x (samples + 1)] [config JSON] [samples]``, a sample is its variable-size
columns' byte sizes (uint32 each, columns sorted by name) then each column's bytes, and a shard
closes before the sample that would take it past ``size_limit`` bytes (4 bytes per sample and
the header counted). :class:`MDSShards` writes exactly that for the encodings ``preprocess``
writes (``str``, ``bytes`` and ``ndarray:<dtype>`` without a fixed shape) into a local
directory, uncompressed; every other case (compression, a remote output, another encoding) is
streaming's own writer, :class:`~bcl_stream.formats.mds_writer.CostedMDSWriter`.
``tests/unit/test_mds_local.py`` writes the same records through both and compares every file
byte for byte.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from bcl_stream.formats.mds_costing import CostedMDS
from bcl_stream.io.hashing import digest

SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
"""An ndarray's shape is stored in the smallest of these that holds its largest dimension;
the byte before it is ``ndim << 2 | index here``."""
SIZE_LIMIT_MAX = 2**32
"""Sample offsets are uint32: no shard may reach this many bytes."""


UNITS = {f"{p}b": 1024**i for i, p in enumerate("kmgtpezy", start=1)}


def size_bytes(value: int | float | str) -> int:
    """A shard size limit as streaming's ``bytes_to_int`` reads it: a number, ``"NNNb"``, or a
    number with ``kb`` ... ``yb`` (powers of 1024)."""
    if isinstance(value, int | float):
        return int(value)
    text = value.lower().strip()
    for suffix, factor in UNITS.items():
        if text.endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * factor)
            except ValueError:
                break
    else:
        if text.endswith("b") and text[:-1].isdigit():
            return int(text[:-1])
        if text.isdigit():
            return int(text)
    raise ValueError(f"size limit {value!r}: expected bytes such as 67108864, 64mb or 1.5gb")


def local_encodings(columns: dict[str, str]) -> list[str]:
    """The encodings of ``columns`` :class:`MDSShards` cannot write (empty: it writes them all)."""
    return [e for e in columns.values() if not _supported(e)]


def _supported(encoding: str) -> bool:
    if encoding in ("str", "bytes"):
        return True
    kind, _, dtype = encoding.partition(":")
    if kind != "ndarray" or not dtype or ":" in dtype:
        return False
    try:
        return np.dtype(dtype).name == dtype and np.dtype(dtype).kind in "uif"
    except TypeError:
        return False


def _encode(encoding: str, value: Any, name: str) -> bytes:
    """One column's bytes, as streaming's ``mds_encode`` gives them."""
    if encoding == "str":
        if not isinstance(value, str):
            raise ValueError(
                f"column {name!r} ({encoding}) needs a str, got {type(value).__name__}"
            )
        return value.encode("utf-8")
    if encoding == "bytes":
        if not isinstance(value, bytes):
            raise ValueError(
                f"column {name!r} ({encoding}) needs bytes, got {type(value).__name__}"
            )
        return value
    dtype = encoding.partition(":")[2]
    if not isinstance(value, np.ndarray) or value.dtype.name != dtype:
        got = value.dtype.name if isinstance(value, np.ndarray) else type(value).__name__
        raise ValueError(f"column {name!r} ({encoding}): wrong dtype, got {got}")
    if value.size == 0:
        raise ValueError(f"column {name!r}: an array with 0 elements cannot be stored in MDS")
    if not value.ndim or value.ndim >= 64:
        raise ValueError(f"column {name!r}: an array needs 1 to 63 axes, got {value.ndim}")
    shape = np.asarray(value.shape, dtype=np.int64)
    largest = int(shape.max())
    index = next(i for i, t in enumerate(SHAPE_DTYPES) if largest < 1 << (8 << i))
    head = bytes([(value.ndim << 2) | index]) + shape.astype(SHAPE_DTYPES[index]).tobytes()
    return head + value.tobytes()


class MDSShards:
    """Joint MDS shards in a local directory (the part of streaming's ``MDSWriter`` that
    :class:`~bcl_stream.formats.mds_costing.CostedMDS` builds on; see the module docstring).

    ``out`` must be a local directory, empty or absent; ``compression`` must be None;
    ``hashes``: algorithms of :func:`bcl_stream.io.hashing.digest` for each shard file.
    """

    format = "mds"
    extra_bytes_per_sample = 4

    def __init__(
        self,
        *,
        columns: dict[str, str],
        out: str | tuple[str, str],
        keep_local: bool = False,
        compression: str | None = None,
        hashes: list[str] | None = None,
        size_limit: int | str | None = 1 << 26,
    ) -> None:
        if not isinstance(out, str) or "://" in out:
            raise ValueError(f"MDSShards writes a local directory, not {out!r}")
        if compression:
            raise ValueError("MDSShards writes uncompressed shards (use CostedMDSWriter)")
        unsupported = local_encodings(columns)
        if unsupported:
            raise ValueError(f"MDSShards cannot write the encodings {unsupported}")
        size_limit = size_bytes(size_limit) if size_limit else None
        if size_limit is not None and not 0 <= size_limit < SIZE_LIMIT_MAX:
            raise ValueError(f"size_limit must be in [0, 2**32), got {size_limit}")
        self.hashes = list(hashes or [])
        if self.hashes != sorted(self.hashes):
            raise ValueError(f"hashes must be sorted, got {self.hashes}")
        for algo in self.hashes:
            digest(algo, b"")  # an unknown algorithm fails here, not at the first shard
        self.local = out
        self.remote: str | None = None
        self.keep_local = keep_local
        self.compression = None
        self.size_limit = size_limit or None
        if os.path.exists(out) and os.listdir(out):
            raise FileExistsError(f"Directory is not empty: {out}")
        os.makedirs(out, exist_ok=True)
        self.columns = columns
        self.column_names = sorted(columns)
        self.column_encodings = [columns[n] for n in self.column_names]
        self.column_sizes = [None for _ in self.column_names]
        self.config_data = json.dumps(self.get_config(), sort_keys=True).encode("utf-8")
        self.shards: list[dict[str, Any]] = []
        self._start_shard()

    def get_config(self) -> dict[str, Any]:
        """The shard-writing configuration stored in every shard and its index entry."""
        return {
            "version": 2,
            "format": self.format,
            "compression": self.compression,
            "hashes": self.hashes,
            "size_limit": self.size_limit,
            "column_names": self.column_names,
            "column_encodings": self.column_encodings,
            "column_sizes": self.column_sizes,
        }

    def _start_shard(self) -> None:
        self.pending: list[bytes] = []
        self.pending_bytes = 4 + 4 + len(self.config_data)

    def encode_sample(self, sample: dict[str, Any]) -> bytes:
        data = [
            _encode(encoding, sample[name], name)
            for name, encoding in zip(self.column_names, self.column_encodings, strict=True)
        ]
        return np.asarray([len(d) for d in data], np.uint32).tobytes() + b"".join(data)

    def write(self, sample: dict[str, Any]) -> None:
        """Add one sample, first closing the open shard if the sample would take it past
        ``size_limit``."""
        encoded = self.encode_sample(sample)
        size = len(encoded) + self.extra_bytes_per_sample
        if self.size_limit and self.size_limit < self.pending_bytes + size:
            self.close_shard()
            self._start_shard()
        self.pending.append(encoded)
        self.pending_bytes += size

    def close_shard(self) -> None:
        """Write the open shard's file and record its index entry."""
        count = np.uint32(len(self.pending))
        sizes = [len(s) for s in self.pending]
        offsets = np.array([0, *sizes]).cumsum().astype(np.uint32)
        offsets += len(count.tobytes()) + len(offsets.tobytes()) + len(self.config_data)
        data = count.tobytes() + offsets.tobytes() + self.config_data + b"".join(self.pending)
        basename = f"shard.{len(self.shards):05}.{self.format}"
        with open(os.path.join(self.local, basename), "wb") as fh:
            fh.write(data)
        raw = {
            "basename": basename,
            "bytes": len(data),
            "hashes": {algo: digest(algo, data) for algo in self.hashes},
        }
        entry = {"samples": len(self.pending), "raw_data": raw, "zip_data": None}
        entry.update(self.get_config())
        self.shards.append(entry)

    def finish(self) -> None:
        """Write the last shard, then the index (:meth:`_end`)."""
        if self.pending:
            self.close_shard()
            self._start_shard()
        self._end()

    def _end(self) -> None:
        with open(os.path.join(self.local, "index.json"), "w") as fh:
            json.dump({"version": 2, "shards": self.shards}, fh, sort_keys=True)


class LocalCostedMDSWriter(CostedMDS, MDSShards):  # type: ignore[misc]
    """:class:`~bcl_stream.formats.mds_writer.CostedMDSWriter`'s shards, counts and ending, to
    a local directory without importing streaming (what ``preprocess`` writes there)."""

    def _close_shard_at(self, records: int | None) -> None:
        if records is not None and len(self.pending) >= records:
            self.close_shard()
            self._start_shard()

    def _wait_for_uploads(self) -> bool:
        if self.pending:
            raise RuntimeError("internal error: not every sample was flushed before the index")
        return True  # a local directory: nothing is uploaded

    def _abandon_uploads(self) -> None:
        return None

    def _end(self) -> None:
        self.write_dataset_index()
