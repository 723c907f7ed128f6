"""The bounded LRU map (``planner/lru.py``) the node streams and the WebDataset reader share:
a hit becomes the most recently used, an insertion past the bound drops the least recently
used and hands it to ``on_evict`` (the reader closes the shard index it drops)."""

from __future__ import annotations

from bcl_stream.planner.lru import Lru


def test_the_least_recently_used_entry_is_dropped_and_handed_over() -> None:
    dropped: list[str] = []
    lru: Lru[int, str] = Lru(2, dropped.append)
    lru.put(1, "one")
    lru.put(2, "two")
    assert lru.get(1) == "one"  # 1 is now the most recently used
    lru.put(3, "three")
    assert dropped == ["two"] and 2 not in lru and len(lru) == 2
    assert 1 in lru and 3 in lru  # a look does not reorder
    lru.put(4, "four")
    assert dropped == ["two", "one"]
    assert lru.get(2) is None and sorted(lru.values()) == ["four", "three"]
    lru.clear()
    assert len(lru) == 0 and dropped == ["two", "one"]  # clear hands nothing over
