"""``within``: the wall-clock bound on one download attempt, and what a stall reports."""

from __future__ import annotations

import re
import threading

import pytest

from bcl_stream.io.deadline import DownloadStalled, within


def test_a_stalled_call_names_where_its_thread_waits() -> None:
    release = threading.Event()

    def wait_for_the_store() -> None:
        release.wait(30)

    try:
        with pytest.raises(
            DownloadStalled, match=re.escape("shard-7.tar: no answer within 0.2 s")
        ) as info:
            within(0.2, wait_for_the_store, "shard-7.tar")
    finally:
        release.set()
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "bcl-download shard-7.tar" in notes
    assert "wait_for_the_store" in notes


def test_a_call_that_ends_in_time_returns_or_raises_its_own_outcome() -> None:
    assert within(5, lambda: 42, "fast") == 42
    with pytest.raises(KeyError):
        within(5, lambda: {}["missing"], "broken")
