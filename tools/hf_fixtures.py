"""Write the fidelity fixtures of the ``hf_rebalance`` peer from Transformers' own class.

``tests/unit/fixtures/hf_rebalance_upstream.json`` was produced by this script, run once with
the real ``transformers.trainer_pt_utils.BatchRebalanceSampler`` (Transformers 5.23.0, torch
2.14.1) in a separate virtualenv: mosaicml-streaming pins transformers < 5, so the class cannot
be imported beside this project's own dependencies.

    python3.11 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.14.1 transformers==5.23.0 numpy
    /tmp/hfvenv/bin/python tools/hf_fixtures.py --out tests/unit/fixtures/hf_rebalance_upstream.json

Without transformers >= 5 it says so and exits with status 0 (nothing to regenerate). It does
not import ``bcl_stream``. Each case records its inputs, the epoch order the sampler drew
(``torch.randperm`` with ``seed + epoch``; the reproduction takes the order as given), what the
sampler yields on every rank, and how often the class froze a slot (``_relieve_and_freeze``),
so the tests can check that the rare path is covered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _lengths(kind: str, n: int, rng: np.random.Generator) -> list[int]:
    """Record lengths of one shape: SFT-like, narrow (grade-school math), many ties, a heavy
    tail (a few records near the 8192 cap), all equal."""
    if kind == "lognormal":
        x = rng.lognormal(5.5, 1.0, n)
    elif kind == "narrow":
        x = rng.normal(220, 40, n)
    elif kind == "ties":
        x = rng.integers(1, 6, n) * 64
    elif kind == "heavy":
        x = np.where(rng.random(n) < 0.03, rng.integers(4000, 8193, n), rng.lognormal(5, 0.8, n))
    elif kind == "equal":
        x = np.full(n, 512)
    else:
        raise ValueError(kind)
    return [int(v) for v in np.clip(x, 1, 8192)]


CASES: list[dict[str, Any]] = [
    # (lengths kind, n, dp, grad_accum, per-device batch, seed, epoch, shuffle, drop_last)
    {
        "kind": kind,
        "n": n,
        "dp": dp,
        "ga": ga,
        "bs": bs,
        "seed": seed,
        "epoch": ep,
        "shuffle": sh,
        "drop_last": dl,
    }
    for kind, n, dp, ga, bs, seed, ep, sh, dl in [
        ("lognormal", 600, 8, 4, 8, 42, 0, True, True),  # the benchmark's shape, 2 steps + tail
        ("lognormal", 600, 8, 4, 8, 42, 1, True, False),  # next epoch, tail kept
        ("narrow", 520, 8, 4, 8, 7, 0, True, True),
        ("heavy", 520, 8, 4, 8, 3, 0, True, True),
        ("heavy", 300, 4, 2, 16, 11, 0, True, False),
        ("ties", 200, 2, 4, 4, 0, 0, True, False),
        ("ties", 97, 3, 2, 5, 5, 2, False, False),
        ("equal", 100, 4, 2, 4, 1, 0, True, False),
        ("lognormal", 64, 1, 1, 8, 9, 0, True, False),
        ("lognormal", 130, 4, 4, 4, 13, 0, True, False),  # tail of 2 < K=16: padded
        ("heavy", 200, 16, 1, 4, 21, 0, True, True),
        ("heavy", 256, 2, 8, 16, 17, 0, False, True),
        ("lognormal", 45, 5, 3, 1, 2, 0, True, False),  # one record per group, tail
        ("narrow", 96, 2, 3, 16, 4, 0, True, True),
    ]
]


def run_case(number: int, case: dict[str, Any], sampler_cls: Any) -> dict[str, Any]:
    import torch

    rng = np.random.default_rng(1000 + number)
    lengths = _lengths(case["kind"], case["n"], rng)
    ebs = case["bs"] * case["ga"] * case["dp"]  # Trainer._get_train_sampler's effective batch
    freezes = 0
    original = sampler_cls._relieve_and_freeze

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal freezes
        freezes += 1
        return original(self, *args, **kwargs)

    sampler_cls._relieve_and_freeze = counting
    try:
        ranks = []
        for rank in range(case["dp"]):
            sampler = sampler_cls(
                lengths=lengths,
                effective_batch_size=ebs,
                dp_size=case["dp"],
                grad_accum=case["ga"],
                shuffle=case["shuffle"],
                seed=case["seed"],
                rank=rank,
                drop_last=case["drop_last"],
            )
            sampler.set_epoch(case["epoch"])
            ranks.append([list(map(int, mb)) for mb in sampler])
    finally:
        sampler_cls._relieve_and_freeze = original
    g = torch.Generator()
    g.manual_seed(case["seed"] + case["epoch"])
    n = len(lengths)
    order = torch.randperm(n, generator=g).tolist() if case["shuffle"] else list(range(n))
    return {
        **case,
        "effective_batch_size": ebs,
        "lengths": lengths,
        "order": order,
        "ranks": ranks,
        "freezes": freezes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        import transformers
        from transformers.trainer_pt_utils import BatchRebalanceSampler
    except ImportError as exc:
        print(f"skipped: needs transformers >= 5 with BatchRebalanceSampler ({exc})")
        return 0
    cases = [run_case(i, c, BatchRebalanceSampler) for i, c in enumerate(CASES)]
    payload = {
        "transformers_version": transformers.__version__,
        "torch_version": __import__("torch").__version__,
        "cases": cases,
    }
    args.out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    frozen = sum(c["freezes"] > 0 for c in cases)
    print(
        f"wrote {args.out}: {len(cases)} cases ({frozen} freeze a slot), transformers {transformers.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
