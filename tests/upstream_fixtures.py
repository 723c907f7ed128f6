"""The pinned outputs of the peers' upstream code (``tests/unit/fixtures/*_upstream.json``),
which the peers' reproductions are compared with: one loader, so every fidelity test reads
them the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "unit" / "fixtures"


def upstream(name: str) -> dict[str, Any]:
    """The fixture ``name`` (``peers``, ``hf_rebalance``): ``FIXTURES/<name>_upstream.json``."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}_upstream.json").read_text())
    return data
