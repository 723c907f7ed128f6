"""A wall-clock bound on one blocking call (a download), for the readers' download deadline.

Why it exists: boto's ``read_timeout`` (what Mosaic Streaming's ``download_timeout`` sets) bounds
each socket read, not a request, and boto retries inside one call; a store that accepts the
connection and never answers (or trickles bytes) therefore held a reader for attempts x boto's
retries x the timeout: about 12 minutes with the defaults, before any error. :func:`within`
gives up on a call after its seconds, so a shard's download ends within ``download_attempts`` x
``download_timeout`` (``bcl_stream.formats.read_options``). Used by our own downloads
(:mod:`bcl_stream.io.remote`) and around streaming's shard preparation
(:mod:`bcl_stream.io.streaming_compat`).
"""

from __future__ import annotations

import threading
from typing import Any


class DownloadStalled(TimeoutError):
    """One download attempt did not finish within its timeout (a store that accepts the
    connection and never answers, or trickles): given up, and retried like any failure."""


def within(seconds: float, action: Any, what: str) -> Any:
    """``action()`` run in a daemon thread, given up after ``seconds`` of wall-clock time
    (:class:`DownloadStalled`). Why a thread: boto's ``read_timeout`` bounds each socket read,
    not a request, and boto retries inside one call, so a stalled store holds a call for
    several timeouts; a thread that overruns is abandoned (it ends when boto gives up)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, action()))
        except BaseException as exc:  # handed to the caller below
            box.append((False, exc))

    worker = threading.Thread(target=run, name=f"bcl-download {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if not box:
        raise DownloadStalled(f"{what}: no answer within {seconds:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value
