"""Inputs of the peers' fidelity fixtures (``tools/multipack_fixtures.py``,
``tools/trl_fixtures.py``): record lengths of a few shapes, drawn the same way for every peer
so that the cases a fixture covers are the same shapes (SFT-like, a heavy tail, narrow, ties).
"""

from __future__ import annotations

import numpy as np

CASES = [  # (kind, records, ranks, capacity or token budget, seed)
    ("lognormal", 600, 2, 1024, 0),
    ("lognormal", 900, 4, 2048, 1),
    ("heavy", 700, 3, 1500, 2),
    ("narrow", 500, 8, 1024, 3),
    ("ties", 400, 4, 700, 4),
    ("heavy", 1200, 8, 4096, 5),
]


def fixture_lengths(
    kind: str, n: int, rng: np.random.Generator, cap: int, *, over_cap: bool
) -> list[int]:
    """``n`` record lengths of one shape. The heavy tail draws 5% of the records from
    ``[cap / 2, cap]``, or past ``cap`` up to 1.25 x ``cap`` with ``over_cap`` (a peer that
    must show what it does with a record over its budget); without ``over_cap`` every length
    is at most ``cap`` (a sampler with no path for a longer record)."""
    if kind == "lognormal":
        x = rng.lognormal(5.0, 1.0, n)
    elif kind == "heavy":
        high = cap + cap // 4 if over_cap else cap + 1
        x = np.where(
            rng.random(n) < 0.05, rng.integers(cap // 2, high, n), rng.lognormal(4.5, 0.8, n)
        )
    elif kind == "narrow":
        x = rng.normal(200, 30, n)
    else:  # ties
        x = (rng.integers(1, 6, n) * 50).astype(np.float64)
    return np.clip(x, 1, None if over_cap else cap).astype(np.int64).tolist()
