"""Run a call under a time bound, so a reader that hangs fails its test instead of the suite.

The call runs in a daemon thread; if it has not returned after ``seconds`` the test fails
naming what hung (the thread is left behind: it cannot be stopped from outside, and a daemon
thread does not keep the process alive). Its result is returned and its exception re-raised
in the caller, so ``pytest.raises`` works around :func:`within` as around the call itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def within(seconds: float, call: Callable[[], T], what: str = "") -> T:
    """``call()``'s result (or its exception, re-raised), failing the test if it takes longer
    than ``seconds``."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="bcl-watchdog")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"hung: {what or call} did not return within {seconds} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
