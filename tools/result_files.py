"""Where a benchmark's figures go: one JSON file under ``results/`` and its plot beside it, a
PNG of the same name.

Why one writer: every results file then has the same form (indent 1 and a final newline, so a
rerun diffs line by line against the committed one) and its PNG is drawn from exactly the dict
that was written, never from a different run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_result(
    result: dict[str, Any],
    out: Path,
    plot: Callable[[dict[str, Any], Path], object] | None = None,
) -> None:
    """Write ``result`` to ``out`` (its directory created) and, given ``plot``, draw it to
    ``out`` with the suffix ``.png``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if plot is not None:
        plot(result, out.with_suffix(".png"))
