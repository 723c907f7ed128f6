"""The per-process plan cache: one eviction rule (least recently used) for every kind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bcl_stream.epoch import cache


@pytest.fixture(autouse=True)
def empty() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def test_a_hit_is_the_same_object_and_makes_nothing() -> None:
    made: list[int] = []
    first = cache.cached(("reader", 1), lambda: made.append(1) or [1])
    assert cache.cached(("reader", 1), lambda: made.append(2) or [2]) is first
    assert made == [1]


def test_least_recently_used_goes_first_whatever_its_kind() -> None:
    kinds = ("reader", "table", "full")
    keys = [(kinds[i % 3], i) for i in range(cache.SIZE)]
    for key in keys:
        cache.cached(key, lambda key=key: key)
    cache.cached(keys[0], lambda: "remade")  # a hit: now the most recently used
    cache.cached(("full", "new"), lambda: "new")  # one over SIZE: evicts keys[1]
    assert cache.cached(keys[0], lambda: "remade") == keys[0]
    assert cache.cached(keys[1], lambda: "remade") == "remade"
