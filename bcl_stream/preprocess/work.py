"""Worker side of preprocessing: raw record chunks -> token ids and loss masks, in a
process pool (``text/layouts.py`` reads each record's layout, ``text/templates.py``
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

from bcl_stream.preprocess.sources import Raw, check_text, parse_payload
from bcl_stream.text.layouts import Bad, Layout, LayoutOptions, Text, read_layout
from bcl_stream.text.templates import Encoded, Encoder, encode_layout

Result = tuple[str, "Encoded | Bad"]


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How every worker reads and encodes records (picklable)."""

    tokenizer: str = "cl100k"
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    loss_on: str = "assistant"
    chat_template: str | None = None
    """``--chat-template FILE``: renders conversations instead of the tokenizer's own."""
    template_kwargs: dict[str, Any] | None = None
    """``--chat-template-kwargs``: template variables for every record."""

    def encoder(self) -> Encoder:
        return Encoder(
            self.tokenizer,
            self.loss_on,
            chat_template=self.chat_template,
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


def read_shape(source: str, payload: Any, layout: LayoutOptions) -> Layout | Bad:
    """A raw record's layout (its JSON parsed, a text checked), or why it has none."""
    record = parse_payload(source, payload)
    if isinstance(record, Bad):
        return record
    shape = read_layout(source, record, layout)
    if isinstance(shape, Text):
        checked = check_text(source, shape.text)
        if isinstance(checked, Bad):
            return checked
    return shape


def encode_raw(source: str, payload: Any, encoder: Encoder, layout: LayoutOptions) -> Result:
    """One raw record -> (source, its ids and mask, or why it has none)."""
    shape = read_shape(source, payload, layout)
    return source, shape if isinstance(shape, Bad) else encode_layout(source, shape, encoder)


def _chunk(raws: list[Raw]) -> tuple[list[Result], float, float]:
    """Results of one chunk, plus seconds spent parsing and tokenizing (for the report:
    parsing is the JSON and the layout, tokenizing the template and the tokenizer)."""
    encoder: Encoder = _STATE["encoder"]
    layout: LayoutOptions = _STATE["layout"]
    out: list[Result] = []
    parse = encode = 0.0
    for source, payload in raws:
        t0 = time.perf_counter()
        shape = read_shape(source, payload, layout)
        t1 = time.perf_counter()
        parse += t1 - t0
        if isinstance(shape, Bad):
            out.append((source, shape))
            continue
        out.append((source, encode_layout(source, shape, encoder)))
        encode += time.perf_counter() - t1
    return out, parse, encode


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
