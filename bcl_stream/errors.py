"""Error types raised by bcl-stream.

Every failure a user can cause (bad data, bad configuration, a checkpoint that does not match)
surfaces as a subclass of :class:`BCLStreamError` whose message names the file or value, what
is wrong and what to do. Bad *arguments* to pure functions raise :class:`ValueError`.

Errors keep their cause: ``raise OurError(message) from exc`` (a test forbids ``from None``).
Front ends print one line with :func:`report`; ``--debug`` or ``BCL_STREAM_DEBUG=1`` prints
the traceback with every cause (``__cause__``) first.
"""

from __future__ import annotations

import os
import sys
import traceback

DEBUG_ENV = "BCL_STREAM_DEBUG"
"""Set to ``1`` to have the command lines print the traceback with every cause on error."""


class BCLStreamError(Exception):
    """Base class of every error bcl-stream raises on purpose."""


class CostIndexError(BCLStreamError):
    """The cost index (``bcl_index.json`` / ``bcl_costs.npy``) is missing, corrupt or mismatched."""


class DatasetError(BCLStreamError):
    """Input records or shards are unreadable, malformed or inconsistent."""


class UnsafeNameError(DatasetError):
    """A name that comes with the data (a shard in an index, a tar member) is absolute, climbs
    out of its directory or is otherwise no safe relative path (:mod:`bcl_stream.io.names`):
    refused before anything is read or written for it."""


class StateError(BCLStreamError):
    """A saved reader state does not match the data or the configuration it is loaded into."""


class PlanError(BCLStreamError):
    """No plan satisfies the constraints (for example a memory cap too small for B records)."""


class RemoteAccessError(DatasetError):
    """The remote store refused or could not be reached (credentials, endpoint, permission,
    bucket). Retrying the same command does not help until the named cause is fixed."""


def debug_requested(flag: bool = False) -> bool:
    """True when ``flag`` (a ``--debug`` option) is set or ``BCL_STREAM_DEBUG`` is set and not 0."""
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report(prog: str, exc: BaseException, *, debug: bool = False) -> int:
    """Print ``exc`` for a user of the command ``prog``; return the exit code (2).

    One line ``PROG: error: MESSAGE`` on stderr; with ``debug`` (see :func:`debug_requested`)
    the traceback with its chain of causes comes first, so the last line is the same.
    """
    if debug_requested(debug):
        traceback.print_exception(exc)
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 2
