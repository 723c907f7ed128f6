"""Error types raised by bcl-stream.

Every failure a user can cause (bad data, bad configuration, a checkpoint that does not match)
surfaces as a subclass of :class:`BCLStreamError` whose message names the file or value, what
is wrong and what to do. Bad *arguments* to pure functions raise :class:`ValueError`.
"""


class BCLStreamError(Exception):
    """Base class of every error bcl-stream raises on purpose."""


class CostIndexError(BCLStreamError):
    """The cost index (``bcl_index.json`` / ``bcl_costs.npy``) is missing, corrupt or mismatched."""


class DatasetError(BCLStreamError):
    """Input records or shards are unreadable, malformed or inconsistent."""


class StateError(BCLStreamError):
    """A saved reader state does not match the data or the configuration it is loaded into."""


class PlanError(BCLStreamError):
    """No plan satisfies the constraints (for example a memory cap too small for B records)."""


class RemoteAccessError(DatasetError):
    """The remote store refused or could not be reached (credentials, endpoint, permission,
    bucket). Retrying the same command does not help until the named cause is fixed."""
