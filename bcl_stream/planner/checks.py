"""Argument checks at the planner's public boundary: one ``ValueError`` that names the argument.

Why: the planner indexes numpy arrays with caller-supplied ids, counts and positions. A wrong
value that gets past the entry point surfaces as an ``IndexError``, a broadcasting error or a
``TypeError`` from inside numpy, with nothing that says which argument was wrong (found by
``tests/unit/test_planner_fuzz.py``). These helpers run once per call on O(shards) or O(window)
values, never on every record, so planning speed is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

MAX_COUNT = 1 << 62
"""Largest count or id accepted: beyond any real dataset, safely inside int64."""


def integer(value: Any, name: str, low: int, high: int = MAX_COUNT) -> int:
    """``value`` as an int if it is an integer (numpy included, bools excluded) in [low, high]."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return int(value)


def array(value: Any, name: str, *, whole: bool) -> npt.NDArray[Any]:
    """``value`` as a 1-D numeric array (a scalar counts as one element).

    ``whole``: the values must be whole numbers within int64 (returned as int64), else finite
    or not, float64. Strings, objects, complex numbers, ragged lists and 2-D input are refused.
    """
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name} must be a 1-D array of numbers ({exc})") from exc
    if arr.ndim > 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numbers, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if not whole:
        return arr.astype(np.float64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError(f"{name} must be whole numbers, got {arr[:5].tolist()} ...")
        if arr.size and np.abs(arr).max() > MAX_COUNT:
            raise ValueError(f"{name} must lie within [-{MAX_COUNT}, {MAX_COUNT}]")
    elif arr.dtype.kind == "u" and arr.size and int(arr.max()) > MAX_COUNT:
        raise ValueError(f"{name} must lie within [0, {MAX_COUNT}], got max {int(arr.max())}")
    return arr.astype(np.int64)


def per_record(value: Any, name: str, n_records: int) -> None:
    """A per-record array (costs, tokens) must be 1-D, numeric and hold ``n_records`` values.

    Checks shape and dtype only (O(1)): the values are checked where they are gathered.
    """
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(f"{name} must be a numpy array, got {type(value).__name__}")
    if len(shape) != 1 or shape[0] != n_records:
        raise ValueError(
            f"{name} must be 1-D with one value per record ({n_records}), got shape {shape}"
        )
    if np.dtype(dtype).kind not in "biuf":
        raise ValueError(f"{name} must be numbers, got dtype {dtype}")


def window_shape(costs: npt.NDArray[np.float64], n_packs: int) -> int:
    """Pack size B of (n_windows, n_packs*B) window costs split into ``n_packs`` equal packs."""
    if costs.ndim != 2:
        raise ValueError(f"costs must be 2-D (windows, records), got shape {costs.shape}")
    if n_packs < 1:
        raise ValueError(f"n_packs must be >= 1, got {n_packs}")
    if costs.shape[1] % n_packs:
        raise ValueError(
            f"window of {costs.shape[1]} records does not split into {n_packs} equal packs"
        )
    return int(costs.shape[1] // n_packs)
