"""Elastic resume cost: how long does a reader take to its first pack after a world-size change?

A checkpoint taken ``--consumed`` packs into an epoch on 16 ranks (8 per node) is resumed on 8
ranks (one node). The reader must know which records the 16 old ranks consumed, then plan the
rest of the epoch for 8 ranks. Measured per (N records, scope), one process each, one core:

- ``fresh_s``: a reader plan for 8 ranks without history, up to rank 0's first pack;
- ``resume_s``: the same reader plan resumed from the 16-rank cursor, up to rank 0's first pack;
- ``ratio`` = resume_s / fresh_s (target: <= 2 at 1M and 100M records, every scope);
- ``fresh_old_world_s``: for scale, a fresh plan of the old world (16 ranks) to rank 0's first
  pack. A resume has to shuffle the first shard group of every old node (2 here) and then the
  new node's (1): about three group shuffles where a fresh 8-rank plan does one.

Both exclude the per-dataset set-up they share (mapping the cost array, its hash, the shard
table: ``setup_s``), which a resumed and a fresh reader pay alike. Costs: lognormal lengths,
llama3-8b, shards of 4096 records, B=8, W=16, seed 0, epoch 0.

``--code DIR`` imports ``bcl_stream`` from another checkout (to time the code before a change
with this same script).

``--canonical``: what canonical ranks cost in balance instead (``bcl_bench/canonical.py``):
a plan for V canonical ranks run on R = V, V/2, V/4 against planning for R directly, on the
real corpora of ``bcl_bench/text_corpora.py`` -> ``results/bench_elastic_canonical.{json,png}``.

Usage::

    python tools/bench_elastic.py                       # 1M and 100M records (~5 minutes)
    python tools/bench_elastic.py --sizes 1e6 --scopes rank
    python tools/bench_elastic.py --canonical --records 200000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import canonical
from bcl_bench.harness import RESULTS, ROOT, bench_parser, run_on_one_core, write_result
from bcl_stream.cost import get_preset
from bcl_stream.epoch.plan import ReaderConfig, ReaderPlan, Segment, costs_and_table
from bcl_stream.io.index import COST_DTYPE, CostIndex, ShardEntry, read_index, write_index
from bcl_stream.process_layout import ProcessLayout

DEFAULT_OUT = RESULTS / "bench_elastic.json"
CANONICAL_OUT = RESULTS / "bench_elastic_canonical.json"
"""Where ``--canonical`` writes unless ``--out`` says (``--suffix`` goes before ``.json``)."""
OLD_RANKS, NEW_RANKS, PER_NODE, PACK, WINDOW, SHARD = 16, 8, 8, 8, 16, 4096


def write_lognormal_index(n: int, root: Path) -> None:
    """A cost index of ``n`` records (lognormal lengths, capped at 8192), written chunk by chunk."""
    model = get_preset("llama3-8b")
    path = root / "records.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=COST_DTYPE, shape=(n,))
    rng = np.random.default_rng(0)
    for lo in range(0, n, 1 << 22):
        size = min(1 << 22, n - lo)
        tok = np.minimum(rng.lognormal(6.1, 1.0, size).astype(np.int64) + 1, 8192)
        out["tokens"][lo : lo + size] = tok
        out["cost"][lo : lo + size] = model.cost(tok)
        out["trained"][lo : lo + size] = tok - 1  # no masks: every target trained
    out.flush()
    records = np.load(path, mmap_mode="r")
    shards = [
        ShardEntry(f"shard.{i:06d}.mds", min(SHARD, n - i * SHARD))
        for i in range((n + SHARD - 1) // SHARD)
    ]
    write_index(root, CostIndex(records, model, tuple(shards), "mds"))
    path.unlink()


def measure(root: Path, scope: str, consumed: int) -> dict[str, Any]:
    """One process: open the index, then time a fresh and a resumed plan to the first pack."""
    t0 = time.perf_counter()
    index = read_index(root)
    config = ReaderConfig.build(
        world_size=NEW_RANKS, ranks_per_node=PER_NODE, pack_size=PACK, window=WINDOW, scope=scope
    )
    costs_and_table(index, config)
    setup_s = time.perf_counter() - t0

    def first_pack(segments: tuple[Segment, ...]) -> tuple[float, int]:
        t = time.perf_counter()
        plan = ReaderPlan(index, config, 0, segments)
        next(plan.iter_rank_packs(0))
        return time.perf_counter() - t, int(plan.consumed.size)

    fresh_s, _ = first_pack(())
    resume_s, n_consumed = first_pack((Segment(OLD_RANKS, PER_NODE, consumed),))
    old_config = config.resized(ProcessLayout(world_size=OLD_RANKS, ranks_per_node=PER_NODE))
    t = time.perf_counter()
    next(ReaderPlan(index, old_config, 0).iter_rank_packs(0))
    fresh_old_s = time.perf_counter() - t
    return {
        "records": len(index),
        "scope": scope,
        "packs_consumed": consumed,
        "records_consumed": n_consumed,
        "setup_s": setup_s,
        "fresh_s": fresh_s,
        "resume_s": resume_s,
        "ratio": resume_s / fresh_s,
        "fresh_old_world_s": fresh_old_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, DEFAULT_OUT)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e8])
    parser.add_argument("--scopes", nargs="+", default=["rank", "node", "world"])
    parser.add_argument("--consumed", type=int, default=1, help="packs per old rank consumed")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to import from")
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "SCOPE"), help=argparse.SUPPRESS)
    parser.add_argument("--canonical", action="store_true", help="canonical ranks' balance cost")
    parser.add_argument("--records", type=int, default=200_000, help="--canonical: per corpus")
    parser.add_argument("--corpora", nargs="+", default=None, help="--canonical: corpus names")
    parser.add_argument(
        "--layouts", nargs="+", default=None, help="--canonical: canonical layouts NODESxRANKS"
    )
    parser.add_argument("--suffix", default="", help="--canonical: result file name suffix")
    args = parser.parse_args(argv)
    if args.canonical:
        layouts = canonical.LAYOUTS
        if args.layouts:
            layouts = tuple(tuple(int(x) for x in s.split("x")) for s in args.layouts)  # type: ignore[misc]
        out = (
            args.out
            if args.out != DEFAULT_OUT
            else CANONICAL_OUT.with_stem(f"{CANONICAL_OUT.stem}{args.suffix}")
        )
        return canonical.run(args.records, args.corpora, out, layouts)
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), args.child[1], args.consumed)))
        return 0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bcl_elastic_") as tmp:
        for size in args.sizes:
            n = int(size)
            root = Path(tmp) / str(n)
            root.mkdir()
            write_lognormal_index(n, root)
            for scope in args.scopes:
                child = ["--child", str(root), scope, "--consumed", str(args.consumed)]
                row = run_on_one_core([__file__, *child], args.code.resolve())
                rows.append(row)
                print(
                    f"{n:>11,} {scope:<6} set-up {row['setup_s']:6.2f}s  fresh "
                    f"{row['fresh_s']:6.3f}s  resume {row['resume_s']:6.3f}s  "
                    f"ratio {row['ratio']:5.2f}",
                    flush=True,
                )
    payload = {
        "setting": {
            "old_ranks": OLD_RANKS,
            "new_ranks": NEW_RANKS,
            "ranks_per_node": PER_NODE,
            "pack_size": PACK,
            "window": WINDOW,
            "shard_records": SHARD,
            "cost_model": "llama3-8b",
            "code": str(args.code.resolve().relative_to(args.code.resolve().parent)),
            "cores_used": 1,
        },
        "target": "resume_s <= 2 x fresh_s at 1M and 100M records, every scope",
        "rows": rows,
    }
    write_result(payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
