"""Worker side of preprocessing: raw record chunks -> token ids and loss masks, in a
process pool (``records/registry.py`` reads each record by its kind, ``text/templates.py``
renders and tokenizes it).

Tokenization is the expensive step (about 90 % of preprocessing time with cl100k), so it runs
in ``workers`` processes; chunks come back in submission order, which keeps the written order
(and so the cost index) identical for any worker count.

A worker only tokenizes: it loads its tokenizer once (the pool's initializer) and imports no
more than that needs. A Hugging Face tokenizer directory is read with the ``tokenizers``
library and its template rendered by ``text/hf_dir.py``, so a worker imports neither
``transformers`` nor torch (``tests/integration/test_preprocess_sft.py`` checks a worker's
modules, that it reads its directory once, and its ids against ``transformers``). Where
``transformers`` is still needed (a directory it changes on loading, a text prompt's special
tokens), a spawned worker loads it with ``USE_TORCH=0`` (and TensorFlow and Flax off) unless
the environment sets those variables: transformers then imports no framework, several seconds
per process that tokenizing does not use. The process calling :func:`tokenize_stream` with
one worker is the caller's and is left as it is.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

from bcl_stream.preprocess.sources import Raw, parse_payload
from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.records.registry import encode_any, encode_record, read_record
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import Encoded, Encoder
from bcl_stream.vision.encode import ImageEncoded, ImageTextEncoder

Result = tuple[str, "Encoded | ImageEncoded | Bad"]


DEFAULT_TOKENIZER = "cl100k"
DEFAULT_TEXT_FIELD = "text"
DEFAULT_LOSS_ON = "assistant"
"""What ``preprocess`` takes for a knob its record source leaves unset."""


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How every worker reads and encodes records (picklable): the record source as
    ``preprocess`` reads it, each knob left unset taking its default."""

    source: RecordSource = field(default_factory=RecordSource)
    processor: str | None = None
    """``--processor DIR``: image-text records through that Hugging Face processor (its
    tokenizer and chat template; the source's ``tokenizer`` is then unused)."""
    max_image_pixels: int | None = None
    """Images above this many pixels are bad records (None: PIL's decompression-bomb limit)."""

    @property
    def tokenizer(self) -> str:
        return self.source.tokenizer or DEFAULT_TOKENIZER

    @property
    def loss_on(self) -> str:
        return self.source.loss_on or DEFAULT_LOSS_ON

    @property
    def layout(self) -> LayoutOptions:
        """Where a record's content is looked for."""
        return LayoutOptions(
            self.source.text_field or DEFAULT_TEXT_FIELD, self.source.messages_field
        )

    @property
    def template_kwargs(self) -> dict[str, Any] | None:
        return self.source.chat_template_kwargs

    def encoder(self) -> Encoder | ImageTextEncoder:
        if self.processor is not None:
            return ImageTextEncoder(
                self.processor, self.loss_on, max_image_pixels=self.max_image_pixels
            )
        return Encoder(
            self.tokenizer,
            self.loss_on,
            chat_template=self.source.chat_template,
            template_kwargs=self.template_kwargs,
        )


_STATE: dict[str, Any] = {}
WORKER_ENV = {"USE_TORCH": "0", "USE_TF": "0", "USE_FLAX": "0"}
"""Set in a spawned worker (where not set already) before its tokenizer loads: transformers
then imports no deep-learning framework (see the module docstring)."""
QUIET_IMPORT = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
"""Set while a worker loads its tokenizer: transformers' advice that no framework was found
is what the worker asked for."""


def _init(options: EncodeOptions) -> None:
    _STATE["encoder"] = options.encoder()
    _STATE["layout"] = options.layout


def _init_worker(options: EncodeOptions) -> None:
    """A spawned worker's initializer: no framework for transformers, then the tokenizer."""
    for name, value in WORKER_ENV.items():
        os.environ.setdefault(name, value)
    quiet = os.environ.get(QUIET_IMPORT)
    os.environ[QUIET_IMPORT] = "1"
    try:
        _init(options)
    finally:
        if quiet is None:
            del os.environ[QUIET_IMPORT]
        else:
            os.environ[QUIET_IMPORT] = quiet


@contextmanager
def tokenizer_pool(workers: int, options: EncodeOptions) -> Iterator[Pool]:
    """``workers`` spawned processes, each with its tokenizer loaded once (:func:`_init_worker`).

    spawn: forking a process that may hold torch/streaming threads is unsafe."""
    with get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(options,)) as pool:
        yield pool


def read_shape(source: str, payload: Any, layout: LayoutOptions) -> Any:
    """A raw record's shape by its kind (its JSON parsed), or a :class:`Bad`: why it has none."""
    record = parse_payload(source, payload)
    if isinstance(record, Bad):
        return record
    return read_record(source, record, layout)


def encode_raw(source: str, payload: Any, encoder: Encoder, layout: LayoutOptions) -> Result:
    """One raw text record -> (source, its ids and mask, or why it has none)."""
    shape = read_shape(source, payload, layout)
    return source, shape if isinstance(shape, Bad) else encode_record(source, shape, encoder)


def _chunk(raws: list[Raw]) -> tuple[list[Result], float, float]:
    """Results of one chunk, plus seconds spent parsing and tokenizing (for the report:
    parsing is the JSON and the layout, tokenizing the template and the tokenizer)."""
    encoder: Encoder | ImageTextEncoder = _STATE["encoder"]
    layout: LayoutOptions = _STATE["layout"]
    out: list[Result] = []
    parse = encode = 0.0
    for source, payload in raws:
        t0 = time.perf_counter()
        if isinstance(encoder, ImageTextEncoder):  # image-text: bcl_stream/vision/encode.py
            record = parse_payload(source, payload)
            t1 = time.perf_counter()
            parse += t1 - t0
            out.append((source, _image_text(source, record, encoder, layout)))
            encode += time.perf_counter() - t1
            continue
        shape = read_shape(source, payload, layout)
        t1 = time.perf_counter()
        parse += t1 - t0
        if isinstance(shape, Bad):
            out.append((source, shape))
            continue
        out.append((source, encode_record(source, shape, encoder)))
        encode += time.perf_counter() - t1
    return out, parse, encode


def _image_text(
    source: str, record: dict[str, Any] | Bad, encoder: ImageTextEncoder, layout: LayoutOptions
) -> ImageEncoded | Encoded | Bad:
    """A record under ``--processor``: with images, the image-text kind's encoding
    (``records/image_text.py``: components and image bytes too); without, its own kind's,
    under the processor's tokenizer and chat template."""
    return record if isinstance(record, Bad) else encode_any(source, record, encoder, layout)


def _chunks(raws: Iterable[Raw], size: int) -> Iterator[list[Raw]]:
    chunk: list[Raw] = []
    for raw in raws:
        chunk.append(raw)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_stream(
    raws: Iterable[Raw],
    options: EncodeOptions,
    *,
    workers: int,
    chunk_size: int = 256,
    seconds: dict[str, float] | None = None,
) -> Generator[Result, None, None]:
    """(source, :class:`Encoded` or :class:`Bad`) for every raw record, in input order.

    ``seconds`` (if given) accumulates ``parse`` and ``tokenize`` time summed over workers.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    timing = seconds if seconds is not None else {}
    timing.setdefault("parse", 0.0)
    timing.setdefault("tokenize", 0.0)

    def unpack(done: tuple[list[Result], float, float]) -> list[Result]:
        timing["parse"] += done[1]
        timing["tokenize"] += done[2]
        return done[0]

    if workers == 1:
        _init(options)
        for chunk in _chunks(raws, chunk_size):
            yield from unpack(_chunk(chunk))
        return
    # Submission is bounded (2 chunks per worker in flight) so a large input is never read
    # ahead into memory, which ``Pool.imap`` would do.
    with tokenizer_pool(workers, options) as pool:
        pending: deque[AsyncResult[tuple[list[Result], float, float]]] = deque()
        for chunk in _chunks(raws, chunk_size):
            pending.append(pool.apply_async(_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from unpack(pending.popleft().get())
        while pending:
            yield from unpack(pending.popleft().get())
