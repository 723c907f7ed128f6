"""A costed WebDataset writer: the tar shards ``webdataset.ShardWriter`` writes, plus the
cost index.

Each record becomes one tar sample: ``<key>.input_ids.npy`` (the token ids, ``np.save``
bytes, decoded by stock ``.decode()``), ``<key>.loss_spans.npy`` when the record has a loss
mask (uint32 spans, :mod:`bcl_stream.text.loss_spans`; a record without one trains every
token) and ``<key>.json`` with ``{"source", "tokens", ...}``.
Members are encoded here (as webdataset's default encoder encodes them), so the bytes hashed
into the record's xxh64 (``bcl_hashes.npy``, checked by the reader) are exactly the bytes in
the tar. The shards are written with :mod:`tarfile` in ``ShardWriter``'s exact layout
(``formats/wds_tar.py``), without importing webdataset (which imports torch: seconds before
the first record).
Keys are the global record id, zero-padded (no dots: WebDataset groups members by the prefix
before the first dot).

WebDataset has no index of its own, so ``bcl_index.json`` (written last, after
``bcl_costs.npy``) is the shard list and the completion marker. Per-shard counts come from the
``post`` hook the shard writer calls as each shard closes. Remote outputs (``s3://``) are staged
in a local directory; each shard is uploaded as soon as it closes, the sidecar after all of
them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bcl_stream.cost import CostModel, resolve
from bcl_stream.formats.dataset_files import as_token_array
from bcl_stream.formats.npy import npy_bytes
from bcl_stream.formats.shard_limits import SHARD_BYTES, SHARD_RECORDS
from bcl_stream.formats.wds_tar import TarShards, encode_members
from bcl_stream.formats.writer_base import FinishOnExit, record_trained, seal_cost_index
from bcl_stream.io.hashing import record_digest
from bcl_stream.io.index import CostIndex, ShardEntry
from bcl_stream.io.remote import is_remote, upload
from bcl_stream.text.loss_spans import LOSS_SPANS

SHARD_PATTERN = "shard-%06d.tar"


class CostedWDSWriter(FinishOnExit):
    """Write token-id records as WebDataset shards plus the cost index.

    ``out``: a local directory or a remote URL. ``maxcount`` (records) and ``maxsize``
    (bytes) close a shard as ``ShardWriter`` closes one; their defaults are the MDS writer's
    (``writer_base.SHARD_RECORDS``, ``SHARD_BYTES``); ``compress=True`` writes gzip shards (``.tar.gz``). ``key_prefix``: a
    part of a partitioned run (``part-I-of-N-``) keys its records ``part-I-of-N-<id in the
    part>``, unique across the merged dataset (no dots: see the module docstring). Use as a
    context manager or call :meth:`finish`.
    """

    def __init__(
        self,
        out: str,
        *,
        cost_model: CostModel | str,
        maxcount: int = SHARD_RECORDS,
        maxsize: float = SHARD_BYTES,
        compress: bool = False,
        tokens_field: str = "input_ids",
        extra: Mapping[str, Any] | None = None,
        key_prefix: str = "",
    ) -> None:
        if maxcount < 1:
            raise ValueError(f"maxcount must be >= 1, got {maxcount}")
        self.cost_model = resolve(cost_model)
        self.tokens_field = tokens_field
        self.extra: dict[str, Any] = dict(extra or {})
        self.remote = out if is_remote(out) else None
        self.local = Path(tempfile.mkdtemp(prefix="bcl_wds_")) if self.remote else Path(out)
        self.local.mkdir(parents=True, exist_ok=True)
        self.shards: list[ShardEntry] = []
        self._tokens = array("I")  # 4 bytes per record, not a Python int each
        self._hashes = array("Q")
        self._trained = array("I")
        self._in_shard = 0
        self._key_prefix = key_prefix
        self._index: CostIndex | None = None
        pattern = SHARD_PATTERN + (".gz" if compress else "")
        # members arrive encoded (see write): what is hashed is what is stored
        self._writer = TarShards(
            str(self.local / pattern), maxcount=maxcount, maxsize=maxsize, post=self._closed
        )

    def _closed(self, fname: str) -> None:
        name = os.path.basename(fname)
        self.shards.append(ShardEntry(name, self._in_shard))
        self._in_shard = 0
        if self.remote:
            upload(fname, self.remote, name)
            os.remove(fname)

    def write(
        self, sample: dict[str, Any], tokens: int | None = None, trained: int | None = None
    ) -> None:
        """Write one record: ``sample[tokens_field]`` (ids) plus JSON-able extras.

        ``sample["loss_spans"]`` (if any) becomes the ``loss_spans.npy`` member and gives the
        trained-token count (else ``trained``, else ``max(tokens - 1, 0)``). Keys holding a
        dot (``"txt"`` style members such as ``"meta.txt"``) pass through as members; every
        other key goes into the ``json`` member.
        """
        n = len(self._tokens)
        member: dict[str, Any] = {"__key__": f"{self._key_prefix}{n:010d}"}
        meta: dict[str, Any] = {}
        for key, value in sample.items():
            if key == self.tokens_field:
                ids = as_token_array(value, n)
                member[f"{key}.npy"] = npy_bytes(ids)
                tokens = int(ids.size) if tokens is None else tokens
            elif key == LOSS_SPANS:
                continue  # checked against the token count below
            elif key == "__key__":
                raise ValueError("record keys are assigned by the writer (global record id)")
            elif "." in key:
                member[key] = value
            else:
                meta[key] = value
        if tokens is None:
            raise ValueError(f"record {n}: no {self.tokens_field!r} and no tokens=n given")
        spans, count = record_trained(sample, int(tokens), trained, n)
        if spans is not None:
            member[f"{LOSS_SPANS}.npy"] = npy_bytes(spans)
        meta["tokens"] = int(tokens)
        member["json"] = json.dumps(meta).encode()
        member = encode_members(member)
        self._writer.write(member)
        self._in_shard += 1
        self._tokens.append(int(tokens))
        self._trained.append(count)
        self._hashes.append(record_digest((k, v) for k, v in member.items() if k != "__key__"))

    def finish(self) -> CostIndex:
        """Close the last shard, write (and upload) the cost index last; output: the index."""
        if self._index is not None:
            return self._index
        self._writer.close()
        index = seal_cost_index(
            self._tokens,
            self.cost_model,
            self.shards,
            "wds",
            self.extra,
            self.local,
            self.remote,
            self._hashes,
            self._trained,
        )
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)
        self._index = index
        return index

    def abort(self) -> None:
        """Close the open shard without writing an index: the output stays incomplete."""
        self._writer.abort()
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)
