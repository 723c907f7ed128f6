"""Download benchmark: which shards each node really fetches from S3, per planning scope
(two nodes on a loopback moto server, each behind its own counting proxy; ``bcl_bench.downloads``
says how it is set up and what each figure means).

Writes ``results/bench_downloads.json``. Usage: ``python tools/bench_downloads.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bcl_bench.downloads import run_benchmark
from bcl_bench.harness import RESULTS, bench_parser, write_result


def main() -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_downloads.json")
    parser.add_argument("--records", type=int, default=24_000)
    parser.add_argument("--shard-size", type=int, default=1 << 16, help="MDS size_limit, bytes")
    args = parser.parse_args()
    shard_group, prefetch = 4, 2
    # A node holds at most two shard groups plus what its ranks prefetch (and the shard being
    # read): a limit of that many shards allows the working set; 5 shards does not.
    working_set = 2 * shard_group + 2 * prefetch + 2
    runs: list[tuple[str, int | None]] = [
        ("rank", None),
        ("node", None),
        ("world", None),
        ("node", working_set),
        ("world", working_set),
        ("node", 5),
    ]
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bcl_bench_downloads_"))
    try:
        result = run_benchmark(
            work=work,
            records=args.records,
            shard_size=args.shard_size,
            runs=runs,
            shard_group=shard_group,
            prefetch=prefetch,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    unlimited = [r for r in result["runs"] if r["cache_limit_mb"] is None]
    fits = [r for r in result["runs"] if (r["cache_limit_shards"] or 0) >= working_set]
    result["working_set_shards"] = working_set
    result["max_amplification"] = max(r["amplification"] for r in result["runs"])
    result["target_amplification_met"] = all(r["amplification"] <= 1.05 for r in result["runs"])
    result["no_duplicate_when_cache_fits"] = all(
        not any(r["duplicate_gets"]) for r in unlimited + fits
    )
    limited = [r for r in result["runs"] if r["cache_limit_mb"] is not None]
    result["cache_limit_max_overshoot_shards"] = max(r["overshoot_shards"] for r in limited)
    result["cache_limit_held_within_one_shard"] = all(r["overshoot_shards"] <= 1 for r in limited)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_result(result, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
