"""Plan hashes: the planner's plans and the simulator's figures of many configurations, hashed,
to prove a refactor changed neither.

A refactor (a module moved, a config regrouped, a function given one home) must leave every
plan and every simulated figure as it was; a test per configuration would pin numbers the
planner is allowed to improve, so this is a check run by hand before and after a change:

    python tools/plan_hashes.py --out /tmp/before.json     # on the commit before
    python tools/plan_hashes.py --compare /tmp/before.json # after: exit 1 naming what differs

The corpus is synthetic and ordered like real data: six sources of log-normal lengths, every
other one sorted by length, capped at 8192 tokens, costed with ``llama3-8b``, cut into shards of
1,000 records. Planner: 6 node layouts x 16 knob variants (scopes, ``snake``, carry,
accumulation, padded cost, ``max_tokens``, the step contract, no stratify, no shuffle, pack
order, the tokens contract in three scopes and both layouts), each hashed with its remainder
and its ``sequential`` baseline, and under the tokens contract again with records excluded.
Simulator: 10 settings (node layouts, padded, carry, the step contract, canonical ranks, no
shuffle, the tokens contract on one and two nodes), every strategy's packs and metrics.
A configuration the planner refuses is recorded with its
message (a refusal that changes is a change too).

Writes ``results/plan_hashes.json`` by default (the hashes of the commit it ran on).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.harness import ROOT, bench_parser, write_result
from bcl_stream.analysis import sim
from bcl_stream.cost import get_preset
from bcl_stream.planner import PlanConfig, ShardTable, plan_epoch, shard_weights

COST_MODEL = "llama3-8b"
LAYOUTS = [(8, 8), (16, 8), (8, 2), (4, 1), (32, 4), (2, 2)]
"""(world size, ranks per node)."""
VARIANTS: list[dict[str, Any]] = [
    {},
    {"scope": "rank"},
    {"scope": "world"},
    {"algorithm": "snake"},
    {"carry": None},
    {"grad_accum": 4},
    {"layout": "padded"},
    {"max_tokens": 16384},
    {"contract": "step", "grad_accum": 2},
    {"stratify": False},
    {"shuffle": False},
    {"pack_order": "stream"},
    {"contract": "tokens", "max_tokens": 4096, "grad_accum": 2},
    {"contract": "tokens", "max_tokens": 4096, "grad_accum": 2, "scope": "rank"},
    {"contract": "tokens", "max_tokens": 4096, "grad_accum": 2, "scope": "world"},
    {"contract": "tokens", "max_tokens": 4096, "grad_accum": 2, "layout": "padded"},
]
SIM_SETTINGS: list[dict[str, Any]] = [
    {},
    {"ranks": 16, "ranks_per_node": 8},
    {"ranks": 8, "ranks_per_node": 2},
    {"ranks": 4, "ranks_per_node": 1, "layout": "padded"},
    {"carry": None},
    {"contract": "step"},
    {"canonical_ranks": 16},
    {"shuffle": False},
    {"contract": "tokens", "max_tokens": 16384, "grad_accum": 4},
    {"contract": "tokens", "max_tokens": 16384, "grad_accum": 4, "ranks": 16, "ranks_per_node": 8},
]
EXCLUDED_EVERY = 7
"""Under the tokens contract each plan is also hashed with every 7th record excluded (an
elastic resume's consumed records: the streams' filter then takes its exclusion path)."""


def corpus(n: int, seed: int) -> np.ndarray:
    """Record lengths in write order: six sources, every other one sorted by length."""
    rng = np.random.default_rng(seed)
    parts = []
    for source in range(6):
        lengths = rng.lognormal(5 + 0.4 * source, 0.9, n // 6).astype(np.int64) + 1
        parts.append(np.minimum(np.sort(lengths) if source % 2 == 0 else lengths, 8192))
    return np.concatenate(parts)


def digest(packs: Any) -> str:
    """SHA-256 (16 hex digits) of packs: an array (its bytes and shape) or ragged lists."""
    if isinstance(packs, np.ndarray):
        data = np.ascontiguousarray(packs).tobytes() + str(packs.shape).encode()
        return hashlib.sha256(data).hexdigest()[:16]
    h = hashlib.sha256()
    for rank in packs:
        for pack in rank if isinstance(rank, list | tuple) else [rank]:
            h.update(np.asarray(pack, dtype=np.int64).tobytes())
            h.update(b"|")
        h.update(b"#")
    return h.hexdigest()[:16]


def plan_hashes() -> dict[str, Any]:
    tokens = corpus(12000, 0)
    costs = get_preset(COST_MODEL).cost(tokens)
    counts = [1000] * (tokens.size // 1000) + ([tokens.size % 1000] if tokens.size % 1000 else [])
    table = ShardTable.build(counts, weight=shard_weights(counts, costs))
    out: dict[str, Any] = {}
    for (world, per_node), variant in itertools.product(LAYOUTS, VARIANTS):
        knobs = {"pack_size": 8, "window": 8, "world_size": world, "ranks_per_node": per_node}
        knobs.update(variant)
        key = "plan " + json.dumps(knobs, sort_keys=True)
        try:
            config = PlanConfig(**knobs)
            plan = plan_epoch(costs, table, config, seed=3, epoch=1, tokens=tokens)
            baseline = plan_epoch(
                costs, table, config, seed=3, epoch=1, tokens=tokens, balanced=False
            )
        except ValueError as exc:
            out[key] = f"refused: {exc}"
            continue
        remainder = {k: digest(np.asarray(v)) for k, v in sorted(plan.remainder.items())}
        out[key] = [digest(plan.packs), remainder, digest(baseline.packs)]
        if config.contract == "tokens":
            gone = np.arange(0, tokens.size, EXCLUDED_EVERY, dtype=np.int64)
            rest = plan_epoch(costs, table, config, seed=3, epoch=1, tokens=tokens, excluded=gone)
            out[key].append(digest(rest.packs))
    return out


def sim_hashes() -> dict[str, Any]:
    tokens = corpus(6000, 1)
    model = get_preset(COST_MODEL)
    out: dict[str, Any] = {}
    for setting in SIM_SETTINGS:
        key = "sim " + json.dumps(setting, sort_keys=True)
        config = sim.SimConfig(**setting)
        planned = sim.schedules(tokens, model, config)
        metrics = sim.score(planned, config)
        out[key] = {
            name: [digest(s.packs) if len(s.packs) else "", repr(metrics[name])]
            for name, s in sorted(planned.items())
        }
    return out


def main() -> int:
    parser = bench_parser(__doc__, ROOT / "results" / "plan_hashes.json")
    parser.add_argument(
        "--compare", type=Path, help="hashes written before: exit 1 on any difference"
    )
    args = parser.parse_args()
    hashes = {**plan_hashes(), **sim_hashes()}
    if args.compare is not None:
        before = json.loads(args.compare.read_text())["hashes"]
        differ = sorted(k for k in before.keys() | hashes.keys() if before.get(k) != hashes.get(k))
        print(f"{len(hashes)} configurations, {len(differ)} differ")
        for key in differ:
            print(f"  {key}")
        return 1 if differ else 0
    write_result({"hashes": hashes, "configurations": len(hashes)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
