"""A least-recently-used map of bounded size (standard library only).

Why one class: the node streams keep the last shard groups they dealt
(``planner/node_streams.py``) and the WebDataset reader keeps the member indexes of the
shards it has open (``formats/wds_shards.py``); both want a hit to move to the back and an
insertion past the bound to drop the oldest entry (the reader closes what it drops).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``keep`` entries; ``on_evict`` is called with each value dropped."""

    def __init__(self, keep: int, on_evict: Callable[[V], object] | None = None) -> None:
        self.keep = keep
        self._on_evict = on_evict
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``, dropping the least recently used entries past ``keep``."""
        self._items[key] = value
        while len(self._items) > self.keep:
            _, old = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old)

    def values(self) -> Iterator[V]:
        return iter(list(self._items.values()))

    def clear(self) -> None:
        self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items  # a look, not a use: the order stays

    def __len__(self) -> int:
        return len(self._items)
