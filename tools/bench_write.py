"""Benchmark: preprocessing throughput, costed-writer overhead, cost-index size and load time.

Three measurements, written to ``results/bench_write.json`` (+ ``results/bench_write.png``):

1. ``preprocess``: end-to-end ``bcl_stream.preprocess.preprocess`` on a real chat corpus (the
   stdlib corpus from ``bcl_bench/corpora.py``: docstrings and source code as chat records), MDS and
   WDS, with 1 and 2 tokenizer workers: records/s and input MB/s.
2. ``writer_overhead``: the same tokenized records written by stock ``MDSWriter`` and by
   ``CostedMDSWriter`` (and stock ``ShardWriter`` vs ``CostedWDSWriter``), tokenization
   excluded. Runs alternate and the median of ``--repeats`` is kept (the machine is shared).
   Target: ratio <= 1.10. The pipeline-level ratio (preprocess time minus the time to tokenize
   the same texts, over the plain writer's time) is reported too: it also contains reading and
   JSON parsing, which a plain writer fed in-memory records does not do; so is the ratio to a
   naive one-loop script (read, parse, tokenize, stock ``MDSWriter``), tokenization excluded
   from both.
3. ``index``: ``bcl_costs.npy`` / ``bcl_index.json`` size and ``read_index`` time (with and
   without the SHA-256 check) for 1M and 10M records. Target: well under a second.

Usage::

    python tools/bench_write.py [--copies 6] [--repeats 5] [--index-sizes 1000000,10000000]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_bench.writing import (
    bench_preprocess,
    bench_writers,
    corpus,
    naive_pipeline,
    timed,
    tokenized,
)
from bcl_stream.cost import resolve
from bcl_stream.io.index import CostIndex, ShardEntry, read_index, write_index
from bcl_stream.preprocess import preprocess


def bench_index(sizes: list[int], work: Path, repeats: int) -> list[dict[str, Any]]:
    rows = []
    model = resolve("llama3-8b")
    rng = np.random.default_rng(0)
    for n in sizes:
        tokens = np.clip(rng.lognormal(6.0, 1.0, n), 1, 32768).astype(np.uint32)
        shards = [
            ShardEntry(f"shard.{i:05d}.mds", len(c))
            for i, c in enumerate(np.array_split(tokens, max(1, n // 20_000)))
        ]
        start = time.perf_counter()
        index = CostIndex.build(tokens, model, shards, "mds")
        build = time.perf_counter() - start
        root = work / f"index_{n}"
        start = time.perf_counter()
        meta, npy = write_index(root, index)
        write = time.perf_counter() - start
        verified = [timed(lambda r=root: read_index(r, verify=True)) for _ in range(repeats)]
        fast = [timed(lambda r=root: read_index(r, verify=False)) for _ in range(repeats)]
        rows.append(
            {
                "records": n,
                "shards": len(shards),
                "npy_bytes": npy.stat().st_size,
                "json_bytes": meta.stat().st_size,
                "build_s": build,
                "write_s": write,
                "load_verified_s_median": statistics.median(verified),
                "load_unverified_s_median": statistics.median(fast),
                "load_verified_s_all": verified,
            }
        )
        shutil.rmtree(root)
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    w = result["writer_overhead"]["seconds_median"]
    names = list(w)
    left.bar(names, [w[k] for k in names], color=["tab:gray", "tab:blue"] * 2)
    left.set_ylabel("seconds (median)")
    r = result["writer_overhead"]
    left.set_title(
        f"{r['records']} records: costed/plain MDS {r['ratio_mds']:.3f}, WDS {r['ratio_wds']:.3f}"
    )
    rows = result["index"]
    xs = [row["records"] for row in rows]
    right.plot(xs, [row["load_verified_s_median"] for row in rows], "o-", label="load + sha256")
    right.plot(xs, [row["load_unverified_s_median"] for row in rows], "s-", label="load")
    right.set(xscale="log", yscale="log", xlabel="records", ylabel="seconds")
    right.set_title("cost index load time")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench_pipeline(src: Path, work: Path, plain: float, args: Any) -> dict[str, Any]:
    """``preprocess`` (MDS, 1 worker) against the naive loop, alternating, medians kept."""
    ours: list[tuple[float, float, float]] = []
    naive: list[tuple[float, float]] = []
    for _ in tqdm(range(args.pipeline_repeats), desc="pipeline", unit="round"):
        report = preprocess([str(src)], str(work / "p1"), workers=1, overwrite=True, progress=False)
        ours.append((report.seconds, report.seconds_tokenize, report.seconds_parse))
        shutil.rmtree(work / "p1")
        run = naive_pipeline(src, work)
        naive.append((run["seconds"], run["seconds_tokenize"]))
    ours_rest = statistics.median(t - k for t, k, _ in ours)
    ours_rest_parse = statistics.median(t - k - p for t, k, p in ours)
    naive_rest = statistics.median(t - k for t, k in naive)
    return {
        "note": "preprocess (MDS, 1 worker), tokenization timed inside the run; medians",
        "repeats": args.pipeline_repeats,
        "preprocess_runs": ours,
        "naive_runs": naive,
        "plain_mds_writer_s": plain,
        "preprocess_excluding_tokenization_s": ours_rest,
        "naive_excluding_tokenization_s": naive_rest,
        "ratio_excluding_tokenization": ours_rest / plain,
        "ratio_excluding_tokenization_and_parsing": ours_rest_parse / plain,
        "ratio_vs_naive_excluding_tokenization": ours_rest / naive_rest,
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_write.json")
    parser.add_argument("--records", type=int, default=None, help="cap on stdlib corpus records")
    parser.add_argument("--copies", type=int, default=6, help="concatenate the corpus N times")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pipeline-repeats", type=int, default=3)
    parser.add_argument("--index-sizes", default="1000000,10000000")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_write_"))
    try:
        src = work / "stdlib_chat.jsonl"
        n = corpus(src, args.records, args.copies)
        print(f"corpus: {n} records, {src.stat().st_size / 1e6:.1f} MB", file=sys.stderr)
        pre = bench_preprocess(src, work)
        ids, sources, parse_s, tok_s = tokenized(src)
        writers = bench_writers(ids, sources, work, args.repeats)
        writers["pipeline"] = bench_pipeline(src, work, writers["seconds_median"]["mds"], args)
        writers["pipeline"].update(standalone_parse_s=parse_s, standalone_tokenize_s=tok_s)
        sizes = [int(s) for s in args.index_sizes.split(",") if s]
        result = {
            "note": "shared 2-core machine; medians of alternating runs",
            "corpus": {
                "records": n,
                "bytes": src.stat().st_size,
                "source": f"stdlib chat corpus (bcl_bench/corpora.py) x{args.copies}",
            },
            "preprocess": pre,
            "writer_overhead": writers,
            "index": bench_index(sizes, work, args.repeats),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(result, args.out, plot)
    w = result["writer_overhead"]
    print(f"writer overhead: MDS {w['ratio_mds']:.3f}, WDS {w['ratio_wds']:.3f} (target <= 1.10)")
    p = w["pipeline"]
    print(
        f"pipeline ratio excl. tokenization: {p['ratio_excluding_tokenization']:.3f}, "
        f"excl. tokenization and parsing: {p['ratio_excluding_tokenization_and_parsing']:.3f}, "
        f"vs a naive loop excl. tokenization: {p['ratio_vs_naive_excluding_tokenization']:.3f}"
    )
    for row in pre:
        print(
            f"preprocess {row['format']} workers={row['workers']}: {row['records_per_s']:.0f} rec/s,"
            f" {row['mb_per_s']:.2f} MB/s"
        )
    for row in result["index"]:
        print(
            f"index {row['records']}: npy {row['npy_bytes'] / 1e6:.1f} MB, load "
            f"{row['load_verified_s_median'] * 1e3:.1f} ms (verified), "
            f"{row['load_unverified_s_median'] * 1e3:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
