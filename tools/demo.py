"""`make demo`: the end-to-end job. Pieces not built yet say so and are skipped."""

from __future__ import annotations

print("bcl-stream demo: the end-to-end pipeline is not built yet (planner and simulator only).")
