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

import sys
import threading
import traceback
from typing import Any

STACK_LINES = 8
"""How many innermost frames of an abandoned attempt a :class:`DownloadStalled` notes."""


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
        raise stalled(worker, f"{what}: no answer within {seconds:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def stalled(worker: threading.Thread, message: str) -> DownloadStalled:
    """The :class:`DownloadStalled` for an abandoned attempt, noting where its thread waits
    now (its innermost frames: a socket read, a lock, DNS), which the chained traceback of
    ``--debug`` shows: without it a hang says only that it hung, not in what."""
    error = DownloadStalled(message)
    frame = sys._current_frames().get(worker.ident or -1)
    if frame is not None:
        where = "".join(traceback.format_stack(frame)[-STACK_LINES:])
        error.add_note(f"the abandoned attempt ({worker.name}) is waiting in:\n{where}")
    return error
