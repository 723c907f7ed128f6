"""Options ``preprocess`` and ``annotate`` share: both cost records under a cost model, may
replace what an earlier run wrote, run worker processes, can be cut into ``--part I/N`` runs
that ``bcl-stream merge`` joins, and draw a progress bar. One declaration, so the two commands
cannot drift apart in spelling or default; what differs (what is replaced, what a worker does,
what a part is) is passed in.
"""

from __future__ import annotations

import argparse

DEFAULT_COST_MODEL = "llama3-8b"
"""The cost model a command uses when none is named (the 8B Llama-3 shape's training FLOPs)."""


def add_write_options(
    p: argparse.ArgumentParser, *, replaces: str, workers: int, workers_help: str, part_help: str
) -> None:
    """``--cost-model``, ``--overwrite`` (of ``replaces``), ``--workers`` (default ``workers``),
    ``--part I/N`` and ``--no-progress``."""
    p.add_argument(
        "--cost-model", default=DEFAULT_COST_MODEL, help="preset name or cost-model JSON"
    )
    p.add_argument("--overwrite", action="store_true", help=f"replace an existing {replaces}")
    p.add_argument("--workers", type=int, default=workers, help=workers_help)
    p.add_argument("--part", default=None, metavar="I/N", help=part_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
