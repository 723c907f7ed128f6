"""The string search that locates a turn on a rendering (``text/turn_search.py``) against a
character-by-character oracle: the first difference and the start of the common suffix of
any two strings, the suffix never reaching back past the first difference."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bcl_stream.text.turn_search import changed, common_prefix

TEXT = st.text(alphabet="ab\n\x00", max_size=40)


def _oracle(text: str, other: str) -> tuple[int, int]:
    n = min(len(text), len(other))
    first = next((k for k in range(n) if text[k] != other[k]), n)
    suffix = 0
    while suffix < n - first and text[-1 - suffix] == other[-1 - suffix]:
        suffix += 1
    return first, len(text) - suffix


@given(TEXT, TEXT)
def test_changed_is_the_character_search(text: str, other: str) -> None:
    assert changed(text, other) == _oracle(text, other)
    assert common_prefix(text, other) == _oracle(text, other)[0]
