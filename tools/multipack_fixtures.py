"""Write the fidelity fixtures of the ``multipack`` peer from the multipack sampler's own code.

``tests/unit/fixtures/multipack_upstream.json`` was produced by this script, run once with the
real ``MultipackDistributedBatchSampler`` of imoneoi/multipack_sampler (``multipack_sampler.py``
at the revision below, which ``bcl_stream/peers/multipack.py`` follows), numba 0.61.2 and
torch as installed here. The upstream file is not part of this repository: pass its path.

    pip install --target /tmp/numba numba==0.61.2 llvmlite==0.44.0
    PYTHONPATH=/tmp/numba python tools/multipack_fixtures.py --upstream multipack_sampler.py \\
        --out tests/unit/fixtures/multipack_upstream.json

It does not import ``bcl_stream``. Each case records its inputs (lengths, ranks, the capacity
``batch_max_length``, the seed), the epoch order the sampler drew
(``np.random.default_rng(seed + epoch).permutation``; the reproduction takes the order as
given) and the batches every rank's sampler yields.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.peer_fixtures import CASES, fixture_lengths

REVISION = "a023ee17f1638d004a97f183ecdc1799bcb24848"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, required=True, help="multipack_sampler.py")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("multipack_sampler", args.upstream)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases: list[dict[str, Any]] = []
    for kind, n, ranks, cap, seed in CASES:
        lengths = fixture_lengths(kind, n, np.random.default_rng(100 + seed), cap, over_cap=False)
        arr = np.asarray(lengths, dtype=np.int64)
        per_rank = []
        for rank in range(ranks):
            sampler = module.MultipackDistributedBatchSampler(
                batch_max_length=cap, lengths=arr, num_replicas=ranks, rank=rank, seed=seed
            )
            per_rank.append([b.tolist() for b in sampler.generate_batches()])
        order = np.random.default_rng(seed=seed).permutation(n).tolist()
        cases.append(
            {
                "kind": kind,
                "lengths": lengths,
                "world_size": ranks,
                "capacity": cap,
                "seed": seed,
                "order": order,
                "ranks": per_rank,
            }
        )
    args.out.write_text(json.dumps({"multipack_revision": REVISION, "cases": cases}))
    print(f"{len(cases)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
