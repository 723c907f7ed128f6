"""Reader knobs users of Mosaic Streaming expect: a cache limit, a download timeout and a
prefetch depth, for both readers and the DataModule.

Mosaic Streaming owns the first two for MDS (its ``StreamingDataset`` downloads, caches and
evicts shards: ``cache_limit``, ``download_timeout`` are passed to it as they are); the
WebDataset reader downloads remote tars itself and applies them the same way (a tar evicted
oldest first once the cache holds more than ``cache_limit`` bytes; each download given up
after ``download_timeout`` seconds, then retried as every download is). ``prefetch`` is ours in
both: how many shards the plan will need next are downloaded ahead of the one being read
(remote datasets; local ones have nothing to fetch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PREFETCH = 2
"""Shards downloaded ahead of the one being read (remote datasets)."""
DEFAULT_DOWNLOAD_TIMEOUT = 60.0
"""Seconds before one download attempt is given up (streaming's own default)."""
DEFAULT_DOWNLOAD_ATTEMPTS = 4
"""Attempts at one shard download before the reader stops with an error: with the default
timeout, a stalled store holds a shard at most 4 x 60 s = 4 minutes."""
_UNITS = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40, "b": 1}


def size_bytes(value: int | str, what: str = "cache_limit") -> int:
    """``"10gb"``, ``"512mb"``, ``1048576`` -> bytes (the spellings streaming accepts)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{what} must be >= 1 byte, got {value}")
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        for suffix, factor in _UNITS.items():
            number = low.removesuffix(suffix).strip()
            if low.endswith(suffix) and number.replace(".", "", 1).isdigit():
                return int(float(number) * factor)
        if low.isdigit():
            return int(low)
    raise ValueError(f"{what} must be a byte count such as 10737418240 or '10gb', got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """How a reader fetches and keeps shards (nothing here changes what it yields)."""

    cache_limit: int | str | None = None
    """Most bytes of shards kept in the local cache of a remote dataset (``"10gb"``); None:
    no limit."""
    download_timeout: float = DEFAULT_DOWNLOAD_TIMEOUT
    """Seconds one shard download may take before it is given up (and retried)."""
    download_attempts: int = DEFAULT_DOWNLOAD_ATTEMPTS
    """Attempts at one shard download; a shard not downloaded within ``download_timeout`` x
    ``download_attempts`` seconds (the deadline, plus a few seconds of back-off) stops the
    reader with an error naming the shard and the deadline."""
    prefetch: int = DEFAULT_PREFETCH
    """Shards the plan needs next, downloaded ahead of the one being read (0: none)."""

    def __post_init__(self) -> None:
        if self.cache_limit is not None:
            size_bytes(self.cache_limit)
        if isinstance(self.download_timeout, bool) or not self.download_timeout > 0:
            raise ValueError(f"download_timeout must be > 0 seconds, got {self.download_timeout!r}")
        if (
            isinstance(self.download_attempts, bool)
            or not isinstance(self.download_attempts, int)
            or self.download_attempts < 1
        ):
            raise ValueError(
                f"download_attempts must be an integer >= 1, got {self.download_attempts!r}"
            )
        if (
            isinstance(self.prefetch, bool)
            or not isinstance(self.prefetch, int)
            or self.prefetch < 0
        ):
            raise ValueError(f"prefetch must be an integer >= 0, got {self.prefetch!r}")

    @property
    def cache_bytes(self) -> int | None:
        return None if self.cache_limit is None else size_bytes(self.cache_limit)

    @property
    def download_deadline(self) -> float:
        """Seconds one shard may take to download, all attempts together."""
        return self.download_timeout * self.download_attempts

    def deadline_text(self) -> str:
        """The deadline as the errors name it (what it is made of, and where to set it)."""
        return (
            f"{self.download_attempts} attempts x {self.download_timeout:g} s "
            f"(download_attempts x download_timeout) = {self.download_deadline:g} s"
        )

    def download_limits(self) -> dict[str, Any]:
        """The limits of one download as :func:`bcl_stream.io.remote.open_cost_index` takes
        them (the cost index files are held to the same deadline as a shard)."""
        return {"timeout": self.download_timeout, "attempts": self.download_attempts}

    def streaming_kwargs(self) -> dict[str, Any]:
        """What Mosaic Streaming's ``StreamingDataset`` takes of these."""
        out: dict[str, Any] = {
            "download_timeout": self.download_timeout,
            "download_retry": self.download_attempts - 1,
        }
        if self.cache_limit is not None:
            out["cache_limit"] = self.cache_limit
        return out
