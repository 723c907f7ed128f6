"""Worker side of preprocessing: raw record chunks -> token ids, in a process pool.

Tokenization is the expensive step (about 90 % of preprocessing time with cl100k), so it runs
in ``workers`` processes; ``Pool.imap`` returns chunks in submission order, which keeps the
written order (and so the cost index) identical for any worker count.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from multiprocessing import get_context
from multiprocessing.pool import AsyncResult
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.preprocess.sources import Bad, Raw, record_text
from bcl_stream.preprocess.tokenizers import Tokenizer, load_tokenizer

Result = tuple[str, "npt.NDArray[np.uint32] | Bad"]

_STATE: dict[str, Any] = {}


def _init(tokenizer: str, text_field: str) -> None:
    _STATE["tokenizer"] = load_tokenizer(tokenizer)
    _STATE["text_field"] = text_field


def _chunk(raws: list[Raw]) -> tuple[list[Result], float, float]:
    """Results of one chunk, plus seconds spent parsing and tokenizing (for the report)."""
    tok: Tokenizer = _STATE["tokenizer"]
    out: list[Result] = []
    parse = encode = 0.0
    for source, payload in raws:
        t0 = time.perf_counter()
        text = record_text(source, payload, _STATE["text_field"])
        t1 = time.perf_counter()
        parse += t1 - t0
        if isinstance(text, Bad):
            out.append((source, text))
            continue
        out.append((source, tok.ids(text)))
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
    tokenizer: str,
    text_field: str,
    *,
    workers: int,
    chunk_size: int = 256,
    seconds: dict[str, float] | None = None,
) -> Generator[Result, None, None]:
    """(source, ids or Bad) for every raw record, in input order.

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
        _init(tokenizer, text_field)
        for chunk in _chunks(raws, chunk_size):
            yield from unpack(_chunk(chunk))
        return
    # spawn: forking a process that may hold torch/streaming threads is unsafe. Submission is
    # bounded (2 chunks per worker in flight) so a large input is never read ahead into memory,
    # which ``Pool.imap`` would do.
    ctx = get_context("spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(tokenizer, text_field)) as pool:
        pending: deque[AsyncResult[tuple[list[Result], float, float]]] = deque()
        for chunk in _chunks(raws, chunk_size):
            pending.append(pool.apply_async(_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from unpack(pending.popleft().get())
        while pending:
            yield from unpack(pending.popleft().get())
