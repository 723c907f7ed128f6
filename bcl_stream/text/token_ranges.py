"""Which tokens a character range of a rendering covers: the rule loss masks are cut by.

A range trains from the token holding its first character to the one holding its last, the
rule ``transformers`` applies to ``{% generation %}`` blocks; tokens that start at the same
character (the pieces of one character) all count. :func:`token_spans` applies it to each
token's first character; :func:`encoding_spans` gives the same spans from a ``tokenizers``
``Encoding`` by asking only for the tokens at the ranges' ends (building the list of every
token's offsets cost a tenth of encoding a conversation), and falls back to
:func:`token_spans` where a range's end lies on a character no token holds (offsets trimmed
of spaces).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.text.loss_spans import spans_from_mask


def token_spans(
    starts: npt.NDArray[np.int64], ranges: list[tuple[int, int]]
) -> npt.NDArray[np.uint32]:
    """Canonical spans of the tokens covering character ranges, from each token's first
    character (non-decreasing)."""
    mask = np.zeros(starts.size, dtype=bool)
    for a, b in ranges:
        if b <= a or not starts.size:
            continue
        first = int(np.searchsorted(starts, a, side="right")) - 1
        first = int(np.searchsorted(starts, starts[max(first, 0)], side="left"))
        last = int(np.searchsorted(starts, b - 1, side="right"))
        mask[first:last] = True
    return spans_from_mask(mask)


class _Unheld(Exception):
    """A character no token holds, or a token without offsets."""


def _start(encoding: Any, token: int) -> int:
    chars = encoding.token_to_chars(token)
    if chars is None:
        raise _Unheld
    return int(chars[0])


def _last_starting_by(encoding: Any, char: int, n: int) -> int:
    """The last token starting at or before ``char`` (what ``searchsorted(starts, char,
    "right") - 1`` finds), reached from the token holding ``char``."""
    token = encoding.char_to_token(char)
    if token is None or _start(encoding, token) > char:
        raise _Unheld
    while token + 1 < n and _start(encoding, token + 1) <= char:
        token += 1
    return int(token)


def encoding_spans(encoding: Any, ranges: list[tuple[int, int]]) -> npt.NDArray[np.uint32]:
    """:func:`token_spans` of a ``tokenizers`` ``Encoding`` (a single sequence)."""
    n = len(encoding)
    mask = np.zeros(n, dtype=bool)
    try:
        for a, b in ranges:
            if b <= a or not n:
                continue
            first = _last_starting_by(encoding, a, n)
            start = _start(encoding, first)
            while first > 0 and _start(encoding, first - 1) == start:
                first -= 1
            mask[first : _last_starting_by(encoding, b - 1, n) + 1] = True
    except _Unheld:
        starts = np.asarray([a for a, _ in encoding.offsets], dtype=np.int64)
        return token_spans(starts, ranges)
    return spans_from_mask(mask)
