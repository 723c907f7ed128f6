"""``preprocess``: input files -> tokenized, costed shards (MDS or WebDataset).

One pass, in input order: read raw records (main process), parse + tokenize (a pool of
``workers`` processes, order kept), apply the bad-record and outlier policies (main), write
(main). Every record read is either written or counted under a reason in the report, and the
report is printed and stored in the cost index (``extra.preprocess``). Records skipped as bad
(``--skip-bad``) are also named: the first few in the report, all of them in
``bcl_skipped.txt`` beside the shards (``file:line<TAB>reason<TAB>message``, one a line).

Records with a loss mask (conversations, prompt/response) are written with ``loss_spans``
(``text/loss_spans.py``). MDS columns are fixed per dataset, so an MDS dataset has the
column on every record unless ``--loss-on all`` (a text record then stores ``[0, L]``, which
trains what no mask trains); WebDataset stores the member only on masked records. A record
truncated by ``--outliers truncate`` keeps the part of its mask that survives the cut (one left
with nothing to train is left out and counted, ``outliers.dropped_untrained``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from bcl_stream.cost import CostModel, resolve
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_costing import CostedMDS
from bcl_stream.formats.mds_local import LocalCostedMDSWriter, local_encodings
from bcl_stream.formats.shard_limits import SHARD_BYTES, SHARD_RECORDS
from bcl_stream.formats.wds_writer import CostedWDSWriter
from bcl_stream.io.remote import join, upload
from bcl_stream.preprocess.lock import output_lock
from bcl_stream.preprocess.outliers import OutlierPolicy
from bcl_stream.preprocess.output import check_output, prepare_output, remove_if_empty
from bcl_stream.preprocess.parts import Part, input_identity, input_slices, part_record
from bcl_stream.preprocess.sources import InputSlice, check_inputs, read_records
from bcl_stream.preprocess.work import EncodeOptions, tokenize_stream
from bcl_stream.records.kind import Bad
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import trained_count
from bcl_stream.text.templates import Encoded
from bcl_stream.vision.preprocess import ImageColumns

T = TypeVar("T")
FORMATS = ("mds", "wds")
DEFAULT_WORKERS = 1
"""Tokenizer processes by default: the fastest measured (``tools/bench_sft_preprocess.py``,
``results/bench_sft_preprocess.json``: on the 2-core development machine one process beat 2
and 4 with cl100k and with a Hugging Face tokenizer, the main process reading and writing
beside it). On a machine with free cores give ``workers`` (measure with that tool)."""
SMALL_INPUT_BYTES = 4 << 20
"""Below this much input, one process: spawning a tokenizer worker takes ~1-2 s here."""
SKIPPED_FILE = "bcl_skipped.txt"
"""Every record skipped as bad, one a line: ``file:line<TAB>reason<TAB>message``."""
SKIPPED_SHOWN = 5
"""Skipped records named in the report itself (the file lists all)."""


@dataclass(slots=True)
class PreprocessReport:
    """What preprocessing did, record by record accounted for."""

    output: str
    format: str
    inputs: list[str]
    tokenizer: str
    cost_model: str
    records_read: int = 0
    records_written: int = 0
    tokens_written: int = 0
    trained_tokens_written: int = 0
    """Trained tokens of the records written (mask positions t >= 1; ``cost index.trained``)."""
    masked_records: int = 0
    """Records written with a loss mask (the rest train every token)."""
    loss_on: str = "assistant"
    chat_template_kwargs: dict[str, Any] | None = None
    """``--chat-template-kwargs``: template variables given to every record."""
    bytes_read: int = 0
    blank_lines: int = 0
    skipped_bad: dict[str, int] = field(default_factory=dict)
    """Bad records skipped under ``skip_bad``, by reason (malformed_json, missing_field, ...)."""
    skipped_first: list[str] = field(default_factory=list)
    """The first skipped bad records, as ``file:line (reason)``."""
    skipped_file: str | None = None
    """Where every skipped record is listed (``bcl_skipped.txt`` in the output)."""
    empty_inputs: list[str] = field(default_factory=list)
    """Input files without a single record, skipped under ``skip_bad``."""
    outliers: dict[str, Any] = field(default_factory=dict)
    shards: int = 0
    seconds: float = 0.0
    seconds_parse: float = 0.0
    """Time parsing records (JSON, UTF-8, chat template), summed over workers."""
    seconds_tokenize: float = 0.0
    """Time in the tokenizer, summed over workers."""
    seconds_read: float = 0.0
    """Main process: reading raw records (file reads, line splitting, Parquet batches)."""
    seconds_write: float = 0.0
    """Main process: the writer's ``write`` (encoding, shard files, background uploads queued)."""
    seconds_finish: float = 0.0
    """Main process: the last shard, waiting for uploads, the cost index and ``index.json``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line."""
        rate = self.records_read / self.seconds if self.seconds else 0.0
        out = [
            f"wrote {self.records_written} records ({self.tokens_written} tokens) in "
            f"{self.shards} {self.format} shards to {self.output}",
            f"trained tokens: {self.trained_tokens_written} ({self.masked_records} records "
            f"with a loss mask, --loss-on {self.loss_on})",
            f"read {self.records_read} records, {self.bytes_read / 1e6:.1f} MB in "
            f"{self.seconds:.1f} s ({rate:.0f} records/s)",
        ]
        if self.blank_lines:
            out.append(f"blank lines ignored: {self.blank_lines}")
        if self.empty_inputs:
            shown = ", ".join(self.empty_inputs[:3]) + (
                " ..." if len(self.empty_inputs) > 3 else ""
            )
            out.append(f"empty inputs skipped: {len(self.empty_inputs)} ({shown})")
        for reason, n in sorted(self.skipped_bad.items()):
            out.append(f"skipped bad records ({reason}): {n}")
        if self.skipped_first:
            more = sum(self.skipped_bad.values()) - len(self.skipped_first)
            out.append(
                "skipped: "
                + ", ".join(self.skipped_first)
                + (f" and {more} more" if more > 0 else "")
                + (f"; all listed in {self.skipped_file}" if self.skipped_file else "")
            )
        o = self.outliers
        if o.get("max_record_tokens") is not None:
            out.append(
                f"outliers above {o['max_record_tokens']} tokens ({o['policy']}): "
                f"truncated {o['truncated']}, dropped {o['dropped']}, "
                f"tokens removed {o['tokens_removed']}"
                + (
                    f", left out with nothing left to train after the cut {o['dropped_untrained']}"
                    if o.get("dropped_untrained")
                    else ""
                )
            )
        return out


def parse_size(text: str) -> int:
    """``"64mb"``, ``"1gb"``, ``"100000"`` -> bytes."""
    units = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "b": 1}
    low = text.strip().lower()
    for suffix, factor in units.items():
        if low.endswith(suffix) and low[: -len(suffix)].strip().isdigit():
            return int(low[: -len(suffix)]) * factor
    if low.isdigit():
        return int(low)
    raise ValueError(f"--shard-size-limit {text!r}: expected bytes such as 67108864 or 64mb")


def _timed(items: Iterator[T], timing: dict[str, float]) -> Iterator[T]:
    """``items``, adding the time spent producing them to ``timing["read"]`` (a stage time
    of the report: what the main process spends reading, beside the workers' tokenizing)."""
    while True:
        t0 = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            timing["read"] += time.perf_counter() - t0
            return
        timing["read"] += time.perf_counter() - t0
        yield item


def _bytes(piece: str | InputSlice) -> int:
    if isinstance(piece, str):
        return os.path.getsize(piece)
    stop = os.path.getsize(piece.path) if piece.stop is None else piece.stop
    return stop - piece.start


def _bad_error(bad: Bad) -> DatasetError:
    return DatasetError(
        f"{bad.source}: {bad.message}. Fix the record, or pass --skip-bad to skip such records "
        "(they are counted and listed)."
    )


def _open_writer(
    fmt: str,
    output: str,
    model: CostModel,
    shard_size_limit: int | str | None,
    compression: str | None,
    maxcount: int,
    part: Part | None = None,
    loss_on: str = "all",
    columns: dict[str, str] | None = None,
) -> Any:
    """The writer of the output's shards: a part's shards are named after the part; MDS
    columns are fixed per dataset, so every record gets ``loss_spans`` unless nothing is
    masked (``loss_on="all"``; a text record stores [0, L]: every token trained, the count of
    no mask)."""
    key_prefix = "" if part is None else f"{part.name}-"
    loss_spans = loss_on != "all"  # under "all" no record is masked
    if fmt == "mds":
        # A local uncompressed output of the columns it can encode (text records' ids and
        # source) is written without importing streaming (which imports torch: seconds before
        # the first record); the same bytes either way. Image-text records' json columns go
        # through streaming's writer.
        mds: type[CostedMDS] = LocalCostedMDSWriter
        every = {"input_ids": "ndarray:uint32", "source": "str", **(columns or {})}
        if "://" in output or compression or local_encodings(every):
            from bcl_stream.formats.mds_writer import CostedMDSWriter

            mds = CostedMDSWriter
        return mds(
            output,
            cost_model=model,
            columns=every,
            compression=compression,
            size_limit=shard_size_limit,
            loss_spans=loss_spans,
            shard_records=maxcount,
        )
    if compression not in (None, "gz", "gzip"):
        raise ValueError(f"--compression {compression!r}: WebDataset shards support only gz")
    if isinstance(shard_size_limit, str):
        shard_size_limit = parse_size(shard_size_limit)
    size = float(shard_size_limit) if shard_size_limit else float(SHARD_BYTES)
    return CostedWDSWriter(
        output,
        cost_model=model,
        maxcount=maxcount,
        maxsize=size,
        compress=bool(compression),
        key_prefix=key_prefix,
    )


def preprocess(
    inputs: list[str],
    output: str,
    *,
    source: RecordSource | None = None,
    format: str = "mds",
    processor: str | None = None,
    max_image_pixels: int | None = None,
    cost_model: str | CostModel = "llama3-8b",
    max_record_tokens: int | None = None,
    outliers: str = "error",
    skip_bad: bool = False,
    overwrite: bool = False,
    workers: int = DEFAULT_WORKERS,
    shard_size_limit: int | str | None = SHARD_BYTES,
    compression: str | None = None,
    maxcount: int = SHARD_RECORDS,
    progress: bool = True,
    part: Part | str | None = None,
) -> PreprocessReport:
    """Tokenize ``inputs`` (JSONL/Parquet) into a costed dataset at ``output`` (dir or s3://).

    Records are read as any kind of ``records/registry.py``, by ``source`` (a
    :class:`RecordSource`; None: every knob at its default): ``text_field`` (default
    ``text``), ``messages_field`` (a conversation field other than
    ``messages``/``conversations``), ``tokenizer`` (default ``cl100k``; a ``tokenizer.json``,
    or a Hugging Face tokenizer directory, whose chat template then renders conversations,
    ``text/templates.py``), ``loss_on`` (``assistant`` by default, ``last``, ``all``: each
    conversation's stored loss mask; prompt/response records train the response unless
    ``all``), ``chat_template`` (a file whose template renders conversations instead of the
    tokenizer directory's own: Jinja text, or a JSON file with ``chat_template``) and
    ``chat_template_kwargs`` (template variables for every record; a record's own
    ``chat_template_kwargs`` take precedence).

    ``processor`` (``--processor DIR``, a Hugging Face processor directory): image-text
    records (``records/image_text.py``), ids exactly as that processor gives them, images stored in
    the shards and their cost components beside the cost index (``vision/preprocess.py``);
    ``max_image_pixels`` refuses larger images (default: PIL's decompression-bomb limit).

    ``workers``: tokenizer processes (default :data:`DEFAULT_WORKERS`, the fastest measured).

    ``part`` (``Part`` or ``"I/N"``): write only the I-th of N shares of the inputs, as a
    complete dataset under ``output/part-I-of-N`` (``preprocess/parts.py``); join the parts
    with :func:`bcl_stream.preprocess.merge.merge`. A part left incomplete by a killed run is
    replaced by the next run of the same part; a complete one only with ``overwrite``.

    Raises :class:`DatasetError` on the first bad record (unless ``skip_bad``), on an outlier
    under ``outliers="error"``, on empty input, on an existing output (unless ``overwrite``)
    and at once when another live process writes the same output (``preprocess/lock.py``).
    """
    part = _checked_request(inputs, format, part)
    target = output if part is None else part.location(output)
    with output_lock(target, "preprocess"):
        return _preprocess(
            inputs,
            target,
            part,
            format=format,
            options=EncodeOptions(
                RecordSource() if source is None else source, processor, max_image_pixels
            ),
            cost_model=cost_model,
            max_record_tokens=max_record_tokens,
            outliers=outliers,
            skip_bad=skip_bad,
            overwrite=overwrite,
            workers=workers,
            shard_size_limit=shard_size_limit,
            compression=compression,
            maxcount=maxcount,
            progress=progress,
        )


def _checked_request(inputs: list[str], format: str, part: Part | str | None) -> Part | None:
    """The format, the inputs and the part checked before any output is touched; the part
    parsed from its ``"I/N"`` text."""
    if format not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {format!r}")
    check_inputs(inputs)
    if isinstance(part, str):
        part = Part.parse(part)
    return part


def _preprocess(
    inputs: list[str],
    output: str,
    part: Part | None,
    *,
    format: str,
    options: EncodeOptions,
    cost_model: str | CostModel,
    max_record_tokens: int | None,
    outliers: str,
    skip_bad: bool,
    overwrite: bool,
    workers: int,
    shard_size_limit: int | str | None,
    compression: str | None,
    maxcount: int,
    progress: bool,
) -> PreprocessReport:
    """Read, tokenize and write the records of ``inputs`` (the locked output checked and
    prepared first), refusing or skipping the bad; a failed run leaves no empty dataset."""
    model = resolve(cost_model)
    policy = OutlierPolicy(max_record_tokens, outliers)
    # The output is checked before the tokenizer loads (a second or more).
    check_output(output, overwrite=overwrite, replace_incomplete=part is not None)
    pieces: list[str | InputSlice] = list(inputs if part is None else input_slices(inputs, part))
    if sum(_bytes(p) for p in pieces) < SMALL_INPUT_BYTES:
        workers = 1  # starting a worker (spawn, imports, tokenizer) costs more than it saves
    encoder = options.encoder()  # fail fast, before any output exists
    tok_name = encoder.tokenizer.name
    created = not os.path.exists(output.removeprefix("file://"))
    prepare_output(output, overwrite=overwrite, replace_incomplete=part is not None)
    report = PreprocessReport(output, format, list(inputs), tok_name, model.name)
    report.loss_on = options.loss_on
    report.chat_template_kwargs = options.template_kwargs
    counts: Counter[str] = Counter()
    images = None if options.processor is None else ImageColumns(format, encoder)
    writer = _open_writer(
        format, output, model, shard_size_limit, compression, maxcount, part, options.loss_on,
        None if images is None else images.mds_columns,
    )  # fmt: skip
    start = time.perf_counter()  # after the writer's imports (streaming for s3:// MDS: seconds)
    sink = _Sink(writer, report, model, policy, images, skip_bad)
    raws = _timed(
        read_records(pieces, counts, report.empty_inputs if skip_bad else None), sink.timing
    )
    # The total is known in bytes (records are not counted before they are read): the bar
    # follows the input read, so it shows a rate and a time left.
    total = sum(_bytes(p) for p in pieces)
    bar = _input_bar(total, progress)
    stream = None
    try:
        stream = tokenize_stream(raws, options, workers=workers, seconds=sink.timing)
        for source, result in stream:
            bar.update(min(counts["bytes_read"], total) - bar.n)
            sink.take(source, result)
        if report.records_written == 0 and part is None:  # an empty part is a valid part
            raise sink.nothing_written(counts)
        # The index's extra: the report first, then what the records were encoded with.
        extra: dict[str, Any] = {"tokenizer": tok_name, "chat_template": encoder.describe()}
        if part is not None:
            extra["part"] = part_record(part, "preprocess", input_identity(inputs))
        sink.finish(counts, start, extra)
    except BaseException:
        writer.abort()
        if created:
            remove_if_empty(output)  # a failed run leaves no empty "dataset" behind
        raise
    finally:
        sink.skip_list.close()
        bar.close()
        if stream is not None:
            stream.close()  # stops the worker pool now, not when the generator is collected
    return report


def _input_bar(total: int, progress: bool) -> tqdm[Any]:
    """The progress bar of ``preprocess``: it follows the input read, in bytes."""
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="preprocess",
        disable=not progress,
        mininterval=0.5,
    )


@dataclass
class _Sink:
    """Where the tokenized records go, in input order: an admitted record to the writer
    (counted in the report), a bad one refused at once or, under ``skip_bad``, counted by
    reason and listed (:class:`_SkipList`), an outlier to the outlier policy."""

    writer: Any
    report: PreprocessReport
    model: CostModel
    policy: OutlierPolicy
    images: ImageColumns | None
    """``--processor``: the image fields and cost components (``vision/``)."""
    skip_bad: bool
    timing: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "write": 0.0})
    """Seconds spent per stage (the tokenizer pool adds ``parse`` and ``tokenize``)."""
    skipped: Counter[str] = field(default_factory=Counter)
    skip_list: _SkipList = field(default_factory=lambda: _SkipList())

    def take(self, source: str, result: Encoded | Bad) -> None:
        """Write, skip (or refuse) or drop one tokenized record."""
        sample = self._admitted(source, result)
        if isinstance(sample, Bad):
            if not self.skip_bad:
                raise _bad_error(sample)
            self.skipped[sample.reason] += 1
            self.skip_list.add(self.writer, sample)
        elif sample is not None:
            self._write(source, sample)

    def _admitted(self, source: str, result: Encoded | Bad) -> Encoded | Bad | None:
        """The record to write, or why it is bad (its encoding, its images, a cost past what
        the index stores), or None: dropped (or truncated) by the outlier policy."""
        if isinstance(result, Bad):
            return result
        if self.images is not None:
            admitted = self.images.admit(
                source, result, self.policy.max_record_tokens, self.policy.policy
            )
            if isinstance(admitted, Bad):
                return admitted
            result = admitted.encoded
        sample = _cut(source, result, self.policy)
        if sample is None:
            return None
        if self.model.first_overflow([sample.ids.size]) is not None:
            message = self.model.overflow_message(int(sample.ids.size))
            return Bad(source, "cost_overflow", message)
        return sample

    def _write(self, source: str, sample: Encoded) -> None:
        t0 = time.perf_counter()
        record: dict[str, Any] = {"input_ids": sample.ids, "source": source}
        if sample.spans is not None:
            record["loss_spans"] = sample.spans
        if self.images is not None:
            record.update(self.images.fields())
        self.writer.write(record)
        self.timing["write"] += time.perf_counter() - t0
        self.report.records_written += 1
        self.report.tokens_written += int(sample.ids.size)
        self.report.trained_tokens_written += sample.trained
        self.report.masked_records += sample.spans is not None

    def nothing_written(self, counts: Counter[str]) -> DatasetError:
        """The refusal of a whole dataset with no record to write, saying where they went."""
        policy = self.policy
        return DatasetError(
            f"no records to write: {counts['records_read']} read, "
            f"{sum(self.skipped.values())} skipped as bad ({dict(self.skipped)}), "
            f"{policy.dropped + policy.dropped_untrained} dropped as outliers, {len(self.report.empty_inputs)} empty inputs skipped. Check "
            "the inputs, --text-field and --messages-field."
        )

    def finish(self, counts: Counter[str], start: float, extra: dict[str, Any]) -> None:
        """Complete the report and close the dataset: the index's ``extra`` holds the report
        (then ``extra``), so the report is filled before the writer finishes, and its
        finishing time and shard count after."""
        self._fill_report(counts, start)
        self.writer.extra.update(preprocess=self.report.to_dict(), **extra)
        if self.images is not None:
            self.images.seal(self.writer)
        t0 = time.perf_counter()
        index = self.writer.finish()
        self.report.seconds_finish = time.perf_counter() - t0
        self.report.shards = len(index.shards)
        self.report.seconds = time.perf_counter() - start

    def _fill_report(self, counts: Counter[str], start: float) -> None:
        """The report's read counts, skips, outliers and timings."""
        report = self.report
        report.records_read = counts["records_read"]
        report.bytes_read = counts["bytes_read"]
        report.blank_lines = counts["blank_lines"]
        report.skipped_bad = dict(self.skipped)
        report.skipped_first = self.skip_list.first
        report.skipped_file = self.skip_list.publish(self.writer)
        report.outliers = self.policy.to_dict()
        report.seconds = time.perf_counter() - start
        report.seconds_parse = self.timing["parse"]
        report.seconds_tokenize = self.timing["tokenize"]
        report.seconds_read = self.timing["read"]
        report.seconds_write = self.timing["write"]


def _cut(source: str, encoded: Encoded, policy: OutlierPolicy) -> Encoded | None:
    """``encoded`` under the outlier policy: as it is, truncated (its mask cut alike), or None
    (dropped; also a masked record that truncation leaves with nothing to train)."""
    ids = policy.apply(source, encoded.ids)
    if ids is None:
        return None
    if ids.size == encoded.ids.size or encoded.spans is None:
        return Encoded(ids, encoded.spans)
    pairs = np.minimum(encoded.spans.astype(np.int64).reshape(-1, 2), ids.size)
    pairs = pairs[pairs[:, 1] > pairs[:, 0]]
    spans = pairs.ravel().astype(np.uint32)
    if trained_count(spans, int(ids.size)) == 0:
        policy.drop_untrained(int(ids.size))
        return None
    return Encoded(ids, spans)


class _SkipList:
    """Records skipped as bad: the first :data:`SKIPPED_SHOWN` kept for the report, every one
    written to ``bcl_skipped.txt`` in the writer's local directory as it comes (memory stays
    flat however many there are), uploaded beside the shards for a remote output."""

    def __init__(self) -> None:
        self.first: list[str] = []
        self._fh: Any = None
        self._path: Path | None = None

    def add(self, writer: Any, bad: Bad) -> None:
        if len(self.first) < SKIPPED_SHOWN:
            self.first.append(f"{bad.source} ({bad.reason})")
        if self._fh is None:
            local = Path(str(writer.local))
            local.mkdir(parents=True, exist_ok=True)
            self._path = local / SKIPPED_FILE
            self._fh = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        message = bad.message.replace("\n", " ")
        self._fh.write(f"{bad.source}\t{bad.reason}\t{message}\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()

    def publish(self, writer: Any) -> str | None:
        """Where the list is (None: nothing was skipped)."""
        if self._path is None:
            return None
        self.close()
        remote = getattr(writer, "remote", None)
        if remote:
            upload(self._path, remote, SKIPPED_FILE)
            return join(remote, SKIPPED_FILE)
        return str(self._path)
