"""Cost indexes as older releases wrote them, for the tests that read old formats."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.io.index import COST_DTYPE_V3, COSTS_NPY, INDEX_JSON


def write_format_3_arrays(root: Path) -> dict[str, Any]:
    """Rewrite the cost array at ``root`` as formats 1-3 store it (8-byte records, no
    ``trained``); output: its ``bcl_index.json`` with the new array's SHA-256, for the caller
    to edit (version, seal) and write back."""
    current = np.load(root / COSTS_NPY)
    old = np.empty(len(current), dtype=COST_DTYPE_V3)
    old["tokens"], old["cost"] = current["tokens"], current["cost"]
    np.save(root / COSTS_NPY, old, allow_pickle=False)
    meta: dict[str, Any] = json.loads((root / INDEX_JSON).read_text())
    meta["sha256"] = hashlib.sha256(old.tobytes()).hexdigest()
    return meta
