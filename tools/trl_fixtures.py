"""Write the fidelity fixtures of the ``trl_token_budget`` peer from TRL's own code.

``tests/unit/fixtures/trl_token_budget_upstream.json`` was produced by this script, run once
on ``trl/experimental/async_grpo/async_grpo_trainer.py`` of huggingface/trl at the revision
below (which ``bcl_stream/peers/trl.py`` follows). The upstream file is not part of this
repository, and importing it needs TRL's whole stack (transformers, accelerate, vLLM
clients); the batcher itself needs only torch and a logger. So the script takes the file,
executes the source of its ``TokenBudgetBatcher`` class unchanged (cut out of the file with
``ast``) with ``torch`` and a logger that records the warnings, and iterates it over fixed
samples:

    git show <revision>:trl/experimental/async_grpo/async_grpo_trainer.py > async_grpo_trainer.py
    python tools/trl_fixtures.py --upstream async_grpo_trainer.py \\
        --out tests/unit/fixtures/trl_token_budget_upstream.json

It does not import ``bcl_stream``. Each case records its inputs (lengths in arrival order,
ranks, ``token_budget``), every micro-batch the batcher yielded as rows of sample positions,
and how many samples it dropped with a warning.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.peer_fixtures import CASES, fixture_lengths

REVISION = "f2cd57710ae345ea6428ae95363267fcf38a3dc8"


class _Logger:
    """Counts the batcher's warnings (its only use of the module's logger)."""

    def __init__(self) -> None:
        self.warnings = 0

    def warning(self, message: str) -> None:
        del message
        self.warnings += 1


def load_batcher(path: Path, logger: _Logger) -> Any:
    """The upstream ``TokenBudgetBatcher`` class, its source executed as it is in the file."""
    import torch

    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TokenBudgetBatcher":
            segment = ast.get_source_segment(source, node)
            assert segment is not None
            namespace: dict[str, Any] = {"torch": torch, "logger": logger}
            exec(compile(segment, str(path), "exec"), namespace)  # the upstream class, unchanged
            return namespace["TokenBudgetBatcher"]
    raise SystemExit(f"{path}: no TokenBudgetBatcher class")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, required=True, help="async_grpo_trainer.py")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cases: list[dict[str, Any]] = []
    for kind, n, ranks, budget, seed in CASES:
        logger = _Logger()
        batcher = load_batcher(args.upstream, logger)
        lengths = fixture_lengths(kind, n, np.random.default_rng(200 + seed), budget, over_cap=True)
        samples = [{"input_ids": [0] * length, "position": i} for i, length in enumerate(lengths)]
        micro_batches = [
            [[s["position"] for s in row] for row in rows]
            for rows in batcher(iter(samples), num_processes=ranks, token_budget=budget)
        ]
        cases.append(
            {
                "kind": kind,
                "lengths": lengths,
                "world_size": ranks,
                "token_budget": budget,
                "micro_batches": micro_batches,
                "dropped": logger.warnings,
            }
        )
    args.out.write_text(json.dumps({"trl_revision": REVISION, "cases": cases}))
    print(f"{len(cases)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
