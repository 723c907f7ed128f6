"""Small SFT datasets for tests: records with ``loss_spans`` written by the costed MDS writer,
and the trained positions written from the data contract (not from the code under test).

Kept free of pytest so subprocess scripts can import it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 96


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "packs",
    "balance",
    "ranks",
    "steps",
    "because",
]
"""The vocabulary of :func:`word_chats`: few words, so a tokenizer trained on the spot knows
them all."""


def word_chats(
    n: int,
    seed: int = 0,
    *,
    exchanges: tuple[int, int] = (1, 4),
    user_words: tuple[int, int] = (1, 30),
    assistant_words: tuple[int, int] = (1, 30),
) -> list[list[dict[str, str]]]:
    """``n`` conversations: a system turn, then ``exchanges`` (low, high: numpy's half-open
    range) user/assistant exchanges of :data:`WORDS` drawn at random, ``user_words`` and
    ``assistant_words`` words per turn. Few structures, many records of each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "You are helpful."}]
        for _ in range(int(rng.integers(*exchanges))):
            for role, (low, high) in (("user", user_words), ("assistant", assistant_words)):
                words = rng.choice(WORDS, int(rng.integers(low, high)))
                messages.append({"role": role, "content": " ".join(words)})
        out.append(messages)
    return out


def records(n: int, *, seed: int = 7, longest: int = 40) -> list[dict[str, np.ndarray]]:
    """Records of 4..longest tokens; most train one or two spans, every fifth all its tokens,
    record 3 only its last token."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(4, longest + 1))
        ids = rng.integers(0, VOCAB, size=length).astype(np.uint32)
        if i % 5 == 0:
            spans = [0, length]
        elif i == 3:
            spans = [length - 1, length]
        else:
            cut = sorted(rng.choice(np.arange(1, length), size=2, replace=False).tolist())
            spans = [cut[0], cut[1]] if i % 2 else [0, cut[0], cut[1], length]
        out.append({"input_ids": ids, "loss_spans": np.asarray(spans, dtype=np.uint32)})
    return out


def span_pack(
    layout: list[tuple[int, list[int] | None]], *, vocab: int = VOCAB, low: int = 0, seed: int = 0
) -> list[dict[str, object]]:
    """A pack of records written out by hand: ``layout`` is (length, loss spans or None)
    per record; token ids are random in [low, vocab), ``sample_id`` is the position."""
    rng = np.random.default_rng(seed)
    pack: list[dict[str, object]] = []
    for i, (n, spans) in enumerate(layout):
        record: dict[str, object] = {
            "input_ids": rng.integers(low, vocab, size=n).astype(np.uint32),
            "sample_id": i,
        }
        if spans is not None:
            record["loss_spans"] = np.asarray(spans, dtype=np.uint32)
        pack.append(record)
    return pack


def write_sft_mds(root: Path, recs: list[dict[str, np.ndarray]]) -> Path:
    """``recs`` as a costed MDS dataset with the ``loss_spans`` column."""
    from bcl_stream.formats.mds_writer import CostedMDSWriter

    columns = {"input_ids": "ndarray:uint32", "loss_spans": "ndarray:uint32"}
    with CostedMDSWriter(str(root), cost_model="tokens", columns=columns, size_limit=2048) as w:
        for record in recs:
            w.write(record)
    return root


def trained_positions(record: dict[str, np.ndarray], max_seq_len: int | None = None) -> np.ndarray:
    """Positions t >= 1 inside a span (and below ``max_seq_len``)."""
    n = record["input_ids"].size
    mask = np.zeros(n, dtype=bool)
    spans = record["loss_spans"].tolist()
    for s, e in zip(spans[::2], spans[1::2], strict=True):
        mask[s:e] = True
    mask[:1] = False
    if max_seq_len is not None:
        mask[max_seq_len:] = False
    return np.flatnonzero(mask)


BAD_SPANS: list[tuple[list[int], str]] = [
    ([1, 3, 5], "odd length"),
    ([3, 3], "interval 0 .* is empty"),
    ([4, 2], "is empty"),
    ([0, 4, 3, 6], "overlap or are unsorted"),
    ([5, 6, 0, 2], "overlap or are unsorted"),
    ([0, 11], "outside the record's 10 tokens"),
]
"""Loss spans a record of 10 tokens cannot have, and the words of the refusal: the stored
form's check (``text/loss_spans.py``) and the collate that meets them in a read record
(``loading/loss_mask.py``) are tested on the same cases."""
