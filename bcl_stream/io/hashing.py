"""Content hashes: one helper for MDS shard hashes and WebDataset record hashes.

MDS shards carry the hash streaming's writer records in ``index.json`` (``xxh64`` by default
in our writer); :func:`digest` recomputes any of those. WebDataset has no index of its own, so
our cost index stores one xxh64 per record (:func:`record_digest`): the reader checks each
record it decodes, which names the damaged record, and keeps the WebDataset reader's main
saving (records other ranks read are skipped from their tar header, never read) instead of
hashing whole shards. Measured: about 1.6 µs per two-member record (mostly Python call
overhead; xxh64 itself runs at GB/s), against ~70 µs to read and decode a record
(tools/bench_loader.py).

The record digest covers exactly what a reader yields: each member's extension (lower case,
as readers key members) and bytes, in extension order, so it does not depend on the order a
writer put members in the tar. Keys starting with ``_`` (metadata ``ShardWriter`` does not
store) are left out.

An MDS dataset written by another tool (stock ``MDSWriter`` records no shard hash by default)
gets the same protection from ``annotate``: one xxh64 per record over the record's bytes in the
shard (:func:`sample_digest`), stored like the WebDataset ones and checked by the reader once
per shard and process (the shard is read whole anyway), naming the damaged record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import xxhash

RECORD_HASH = "xxh64"
"""Algorithm of the per-record hashes in the cost index."""


def digest(algo: str, data: bytes) -> str:
    """Hex digest of ``data`` under ``algo``: an xxhash algorithm (``xxh64``, ``xxh3_64``, ...)
    or any of ``hashlib``'s; the same strings streaming writes into MDS ``index.json``."""
    if algo.startswith("xxh") and algo in xxhash.algorithms_available:
        return str(getattr(xxhash, algo)(data).hexdigest())
    if algo in hashlib.algorithms_available:
        return hashlib.new(algo, data).hexdigest()
    raise ValueError(f"unknown hash algorithm {algo!r}")


def record_digest(members: Iterable[tuple[str, bytes]]) -> int:
    """xxh64 of one record's members ``(extension, bytes)``, as an unsigned 64-bit int."""
    h = xxhash.xxh64()
    for ext, data in sorted((e.lower(), d) for e, d in members if not e.startswith("_")):
        name = ext.encode("utf-8")
        h.update(len(name).to_bytes(4, "little") + name + len(data).to_bytes(8, "little"))
        h.update(data)
    return int(h.intdigest())


def sample_digest(data: bytes | memoryview) -> int:
    """xxh64 of one MDS sample's bytes (its slice of the shard between two offsets: every
    column, as the writer encoded it), as an unsigned 64-bit int: the per-record hash
    ``annotate`` stores for an MDS dataset whose shards carry no content hash."""
    return int(xxhash.xxh64_intdigest(data))
