"""What a costed MDS writer adds to a shard writer, whichever writes the shards: each record's
token and trained-token counts, the ``loss_spans`` column, and the ending (every shard
uploaded, then the cost index, then ``index.json``; see ``formats/mds_writer.py``).

Two shard writers carry it: streaming's ``MDSWriter`` (:class:`~bcl_stream.formats.mds_writer.
CostedMDSWriter`, every encoding, compression, remote outputs) and our own local one
(:class:`~bcl_stream.formats.mds_local.LocalCostedMDSWriter`, which ``preprocess`` uses for a
local uncompressed output so that it never imports streaming, which imports torch). Both write
the same bytes for the same records (``tests/unit/test_mds_local.py``). This module imports
neither.

The shard writer below :class:`CostedMDS` in the method order provides ``write``, ``finish``
(flushing the last shard, then ending in :meth:`CostedMDS.write_dataset_index`), ``shards``,
``local``, ``remote``, ``keep_local`` and ``columns``; the class itself provides the three hooks
:meth:`CostedMDS._close_shard_at`, :meth:`CostedMDS._wait_for_uploads` and
:meth:`CostedMDS._abandon_uploads`.
"""

from __future__ import annotations

import shutil
from array import array
from collections.abc import Mapping
from typing import Any

from bcl_stream.cost import CostModel, resolve
from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import as_token_array
from bcl_stream.formats.shard_limits import SHARD_BYTES, SHARD_RECORDS
from bcl_stream.formats.writer_base import FinishOnExit, record_trained, seal_cost_index
from bcl_stream.io.dataset_dir import MDS_INDEX, MDS_INDEX_VERSION, shard_entries, write_mds_index
from bcl_stream.io.index import CostIndex
from bcl_stream.io.remote import upload
from bcl_stream.text.loss_spans import LOSS_SPANS, LOSS_SPANS_COLUMN, full_spans

DEFAULT_COLUMNS = {"input_ids": "ndarray:uint32"}


class CostedMDS(FinishOnExit):
    """A shard writer that also records each record's token count and writes the cost index.

    ``out`` is a local directory, a remote URL (``s3://...``) or a ``(local, remote)`` pair as
    for ``MDSWriter``. ``columns`` defaults to ``{"input_ids": "ndarray:uint32"}``; the token
    count of a record is ``len(sample[tokens_field])`` unless ``write(sample, tokens=n)`` says.

    Loss masks: with ``loss_spans=True`` (or a ``loss_spans`` column in ``columns``) every
    record stores ``loss_spans`` (``ndarray:uint32``, :mod:`bcl_stream.text.loss_spans`); a
    record written without spans stores ``[0, L]`` (every token trained, the same count as no
    mask). The trained-token count goes into the cost index: from the spans, or
    ``write(sample, trained=k)``, or ``max(L - 1, 0)``.

    A shard closes at ``shard_records`` records or ``size_limit`` bytes, whichever comes first
    (the WebDataset writer's defaults: ``writer_base.SHARD_RECORDS``, ``SHARD_BYTES``).
    """

    columns: dict[str, str]
    shards: list[dict[str, Any]]
    local: str
    remote: str | None
    keep_local: bool

    def __init__(
        self,
        out: str | tuple[str, str],
        *,
        cost_model: CostModel | str,
        columns: Mapping[str, str] | None = None,
        tokens_field: str | None = "input_ids",
        extra: Mapping[str, Any] | None = None,
        compression: str | None = None,
        size_limit: int | str | None = SHARD_BYTES,
        shard_records: int | None = SHARD_RECORDS,
        keep_local: bool = False,
        loss_spans: bool = False,
        **kwargs: Any,
    ) -> None:
        self.cost_model = resolve(cost_model)
        self.tokens_field = tokens_field
        self.extra: dict[str, Any] = dict(extra or {})
        self._tokens = array("I")
        self._trained = array("I")
        self._index: CostIndex | None = None
        if shard_records is not None and shard_records < 1:
            raise ValueError(f"shard_records must be >= 1 or None, got {shard_records}")
        self.shard_records = shard_records
        cols = dict(columns or DEFAULT_COLUMNS)
        if loss_spans:
            cols.update(LOSS_SPANS_COLUMN)
        if cols.get(LOSS_SPANS, LOSS_SPANS_COLUMN[LOSS_SPANS]) != LOSS_SPANS_COLUMN[LOSS_SPANS]:
            raise ValueError(
                f"column {LOSS_SPANS!r} must be {LOSS_SPANS_COLUMN[LOSS_SPANS]!r}, got "
                f"{cols[LOSS_SPANS]!r}"
            )
        self.loss_spans = LOSS_SPANS in cols
        if tokens_field is not None and tokens_field not in cols:
            raise ValueError(
                f"tokens_field {tokens_field!r} is not a column ({sorted(cols)}); "
                "add it to columns or pass tokens_field=None and write(sample, tokens=n)"
            )
        # A content hash per shard: the only way a reader can see a flipped payload byte
        # (bcl_stream.formats.integrity checks it before the first read; xxh64: ~3 ms per 64 MB here).
        kwargs.setdefault("hashes", ["xxh64"])
        super().__init__(  # type: ignore[call-arg]
            columns=cols,
            out=out,
            keep_local=keep_local,
            compression=compression,
            size_limit=size_limit,
            **kwargs,
        )

    # -- what the shard writer under it provides ------------------------------------------
    def _close_shard_at(self, records: int | None) -> None:
        """Close the open shard once it holds ``records`` records (None: no count limit)."""
        raise NotImplementedError

    def _wait_for_uploads(self) -> bool:
        """Wait for every shard upload; output: whether all succeeded."""
        raise NotImplementedError

    def _abandon_uploads(self) -> None:
        """Stop after the queued shard uploads, unflushed records left unwritten."""
        raise NotImplementedError

    # -- the costed writer ----------------------------------------------------------------
    def write(
        self, sample: dict[str, Any], tokens: int | None = None, trained: int | None = None
    ) -> None:
        """Write one record; ``tokens`` overrides the count taken from ``tokens_field``,
        ``trained`` the trained-token count (else from ``sample["loss_spans"]``, else
        ``max(tokens - 1, 0)``)."""
        if tokens is None:
            if self.tokens_field is None:
                raise ValueError("write() needs tokens=n when the writer has no tokens_field")
            value = sample[self.tokens_field]
            ids = as_token_array(value, len(self._tokens))
            if ids is not value and self.columns.get(self.tokens_field) == "ndarray:uint32":
                sample = {**sample, self.tokens_field: ids}
            tokens = ids.size
        if tokens < 0:
            raise ValueError(f"record {len(self._tokens)}: token count {tokens} < 0")
        spans, count = record_trained(sample, tokens, trained, len(self._tokens))
        if spans is not None and not self.loss_spans:
            raise ValueError(
                f"record {len(self._tokens)} has loss_spans but the writer has no such column; "
                "create it with loss_spans=True"
            )
        if self.loss_spans:
            stored = full_spans(tokens) if spans is None else spans
            if not stored.size:  # streaming's ndarray encoding refuses empty arrays
                raise ValueError(
                    f"record {len(self._tokens)} trains no token (empty loss_spans) and MDS "
                    "cannot store an empty array: leave the record out (it adds nothing to the "
                    "loss), or write it to WebDataset"
                )
            sample = {**sample, LOSS_SPANS: stored}
        self._close_shard_at(self.shard_records)
        super().write(sample)  # type: ignore[misc]
        self._tokens.append(tokens)
        self._trained.append(count)

    def write_dataset_index(self) -> None:
        """The end of ``finish()``: every shard uploaded, then the cost index, then
        ``index.json`` (see the module docstring)."""
        if not self._wait_for_uploads():
            raise DatasetError(
                f"uploading shards to {self.remote} failed (see the log above); the dataset is "
                "incomplete: re-run with --overwrite"
            )
        index = seal_cost_index(
            self._tokens,
            self.cost_model,
            shard_entries(self.shards, f"{self.local} (shards written)"),
            "mds",
            self.extra,
            self.local,
            self.remote,
            trained=self._trained,
        )
        path = write_mds_index(self.local, {"version": MDS_INDEX_VERSION, "shards": self.shards})
        if self.remote:
            upload(path, self.remote, MDS_INDEX)
        self._index = index

    def finish(self) -> CostIndex:
        """Flush, write the cost index then ``index.json``; output: the cost index."""
        if self._index is None:
            super().finish()  # type: ignore[misc]
        assert self._index is not None
        return self._index

    def abort(self) -> None:
        """Stop without writing any index: the output stays visibly incomplete.

        Queued shard uploads are let finish (bounded work) rather than cancelled: streaming's
        callbacks log a traceback for every cancelled future.
        """
        self._abandon_uploads()
        if self.remote and not self.keep_local:
            shutil.rmtree(self.local, ignore_errors=True)
