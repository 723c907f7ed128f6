"""The one per-process cache of derived planning data, with one eviction rule.

What is cached is never state: every entry is a pure function of its key (the data's
fingerprint, the reader config, the epoch, the elastic segments) and is recomputed when
evicted. Three kinds share it: a reader's lazy plan of an epoch, a whole-epoch plan (tools,
``bcl-stream plan``, tests) and a dataset's per-record costs with its shard table. One rule:
least recently used goes first once :data:`SIZE` entries are held, whatever their kind.

Why 8: a reader touches at most two epochs at once (the one ending and the next) and one
table per cost model; tools compare a few whole-epoch plans. Each lazy plan is O(shards); a
whole-epoch plan or a table under another cost model is O(records), so a process that plans
whole epochs of a large dataset holds at most 8 of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

V = TypeVar("V")

SIZE = 8
"""Entries held per process, every kind together."""

_ENTRIES: OrderedDict[Hashable, Any] = OrderedDict()


def cached(key: Hashable, make: Callable[[], V]) -> V:
    """The value of ``key``, made by ``make()`` on a miss; the least recently used entry is
    evicted once more than :data:`SIZE` are held. ``key`` must name its kind first (say
    ``("reader", ...)``) so that kinds never collide."""
    if key in _ENTRIES:
        _ENTRIES.move_to_end(key)
        value: V = _ENTRIES[key]
        return value
    value = make()
    _ENTRIES[key] = value
    while len(_ENTRIES) > SIZE:
        _ENTRIES.popitem(last=False)
    return value


def clear() -> None:
    """Drop every entry (tests; a process that is done planning)."""
    _ENTRIES.clear()
