"""Benchmark: preprocessing and annotation throughput against workers and parts.

Extends ``tools/bench_write.py`` (same corpus builder, same naive stock-``MDSWriter`` loop,
same writer-overhead measurement) and writes ``results/bench_preprocess.json``:

1. ``preprocess``: MDS and WDS with 1 and 2 tokenizer workers: records/s, input MB/s, and
   where the time goes (main process: read, write, finish; workers: parse, tokenize, summed).
2. ``parts``: the same corpus as 2 parts run at once as 2 OS processes (what a Slurm array
   does on one machine), then ``merge``; and on a local 2-CPU Ray cluster
   (``preprocess_parts``; the cluster start is timed apart).
3. ``stock``: a naive loop (read, parse, tokenize, stock ``MDSWriter``) in one process, and
   LitData's ``optimize()`` with 1 and 2 workers on the same records and tokenizer, when
   litdata is installed (``pip install 'bcl-stream[bench]'``).
4. ``writer_overhead``: costed / stock ``MDSWriter`` on the same tokenized records
   (``bench_write.bench_writers``; target <= 1.10).
5. ``annotate``: MDS and WDS datasets from (1), 1 and 2 workers, and 2 parts + merge.

Every ratio is taken from runs of this one invocation. Scaling efficiency = rate(K) / (K x
rate(1)); the target is >= 0.8 up to the machine's cores. The development machine has 2 cores
shared with other jobs, so the main process (reading, writing) competes with both workers.

Usage::

    python tools/bench_preprocess.py [--copies 4] [--no-ray] [--no-litdata]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bcl_bench.harness import RESULTS, bench_parser, checkout_env, machine_stamp, write_result
from bcl_bench.writing import bench_preprocess, bench_writers, corpus, naive_pipeline, tokenized
from bcl_stream.preprocess import pipeline
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.preprocess.distributed import preprocess_parts
from bcl_stream.preprocess.merge import merge
from bcl_stream.preprocess.sources import record_text
from bcl_stream.preprocess.tokenizers import load_tokenizer

SHARDS: dict[str, dict[str, Any]] = {
    "mds": {"format": "mds", "shard_size_limit": 2 << 20},
    "wds": {"format": "wds", "maxcount": 1000},
}
"""Shards of ~2 MB / 1000 records: the 1-worker outputs are annotated with 1 and 2 workers,
which needs more than one shard per worker (the 64 MB default makes one shard here)."""

PART = """
import json, sys
from bcl_stream.preprocess import pipeline, preprocess
pipeline.SMALL_INPUT_BYTES = 0
shards = {"mds": {"shard_size_limit": 2 << 20}, "wds": {"maxcount": 1000}}[sys.argv[4]]
r = preprocess([sys.argv[1]], sys.argv[2], part=sys.argv[3], workers=1, format=sys.argv[4],
               progress=False, **shards)
print(json.dumps(r.to_dict()))
"""
ANNOTATE_PART = """
import sys
from bcl_stream.preprocess.annotate import annotate
annotate(sys.argv[1], part=sys.argv[2], workers=1, progress=False, overwrite=True)
"""


def _rate(records: int, size: int, seconds: float) -> dict[str, float]:
    return {
        "seconds": seconds,
        "records_per_s": records / seconds,
        "mb_per_s": size / 1e6 / seconds,
    }


def _processes(script: str, argv: list[list[str]]) -> tuple[float, list[str]]:
    """Run ``python -c script *args`` for each args at once; (wall seconds, stdouts)."""
    env = checkout_env()
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, text=True
        )
        for args in argv
    ]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a part failed: {[p.returncode for p in procs]}")
    return wall, outs


def bench_parts(src: Path, work: Path, parts: int, ray: bool) -> list[dict[str, Any]]:
    size = src.stat().st_size
    rows = []
    for fmt in ("mds", "wds"):
        out = work / f"parts_{fmt}"
        argv = [[str(src), str(out), f"{i}/{parts}", fmt] for i in range(parts)]
        wall, outs = _processes(PART, argv)
        reports = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        start = time.perf_counter()
        index = merge(out)
        merge_s = time.perf_counter() - start
        rows.append(
            {
                "engine": "processes",
                "format": fmt,
                "parts": parts,
                "records": len(index),
                **_rate(len(index), size, wall + merge_s),
                "merge_s": merge_s,
                "part_pipeline_s": [r["seconds"] for r in reports],
                "note": "wall from launch to merged, incl. each process's start-up (imports)",
            }
        )
        shutil.rmtree(out)
    if ray:
        rows.append(_bench_ray(src, work, parts))
    return rows


def _bench_ray(src: Path, work: Path, parts: int) -> dict[str, Any]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every port on 127.0.0.1
    import ray

    pipeline.SMALL_INPUT_BYTES = 0
    start = time.perf_counter()
    ray.init(num_cpus=parts, include_dashboard=False, log_to_driver=False)
    cluster_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        run = preprocess_parts([str(src)], str(work / "ray"), parts=parts, workers=1)
        wall = time.perf_counter() - start
    finally:
        ray.shutdown()
    shutil.rmtree(work / "ray")
    return {
        "engine": "ray",
        "format": "mds",
        "parts": parts,
        "records": len(run.index),
        **_rate(len(run.index), src.stat().st_size, wall),
        "cluster_start_s": cluster_s,
        "part_pipeline_s": [r.seconds for r in run.reports.values()],
        "note": "local Ray cluster of 2 CPUs; wall from submit to merged, cluster start apart",
    }


_TOKENIZER: list[Any] = []


def litdata_fn(chunk: tuple[str, int, int]) -> Any:
    """One LitData input: a byte range of the JSONL corpus -> its records' token ids."""
    import numpy as np

    if not _TOKENIZER:
        _TOKENIZER.append(load_tokenizer("cl100k"))
    path, start, stop = chunk
    with open(path, "rb") as fh:
        fh.seek(start)
        lines = fh.read(stop - start).splitlines()
    for line in lines:
        text = record_text(path, line, "text")
        assert isinstance(text, str)
        yield {"input_ids": np.asarray(_TOKENIZER[0].ids(text), dtype=np.uint32)}


def bench_litdata(src: Path, work: Path) -> list[dict[str, Any]] | str:
    try:
        from litdata import optimize
    except ImportError as exc:
        return f"left out: litdata is not installed ({exc}); pip install 'bcl-stream[bench]'"
    chunks, start, n = [], 0, 0
    with src.open("rb") as fh:  # inputs of 256 lines each, as byte ranges
        for _ in fh:
            n += 1
            if n % 256 == 0:
                chunks.append((str(src), start, fh.tell()))
                start = fh.tell()
        if fh.tell() > start:
            chunks.append((str(src), start, fh.tell()))
    rows = []
    for workers in (1, 2):
        out = work / f"litdata_{workers}"
        t0 = time.perf_counter()
        optimize(
            fn=litdata_fn, inputs=chunks, output_dir=str(out), chunk_bytes="64MB",
            num_workers=workers, mode="overwrite", verbose=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        rows.append({"workers": workers, "records": n, **_rate(n, src.stat().st_size, wall)})
        shutil.rmtree(out, ignore_errors=True)
    return rows


def bench_annotate(work: Path, parts: int) -> list[dict[str, Any]]:
    rows = []
    for fmt in ("mds", "wds"):
        root = work / f"pre_{fmt}_1"
        size = sum(p.stat().st_size for p in root.iterdir())
        for workers in (1, 2):
            t0 = time.perf_counter()
            index = annotate(root, overwrite=True, progress=False, workers=workers)
            wall = time.perf_counter() - t0
            rows.append(
                {"format": fmt, "workers": workers, "parts": 1, **_rate(len(index), size, wall)}
            )
        wall, _ = _processes(ANNOTATE_PART, [[str(root), f"{i}/{parts}"] for i in range(parts)])
        t0 = time.perf_counter()
        index = merge(root)
        merge_s = time.perf_counter() - t0
        rows.append(
            {
                "format": fmt, "workers": 1, "parts": parts, "merge_s": merge_s,
                **_rate(len(index), size, wall + merge_s),
                "note": "parts as processes, wall incl. start-up, plus merge",
            }
        )  # fmt: skip
    return rows


def _efficiency(rows: list[dict[str, Any]], key: str, **match: Any) -> float | None:
    pick = {
        r[key]: r["records_per_s"] for r in rows if all(r.get(k) == v for k, v in match.items())
    }
    return pick[2] / (2 * pick[1]) if 1 in pick and 2 in pick else None


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_preprocess.json")
    parser.add_argument("--copies", type=int, default=4, help="concatenate the corpus N times")
    parser.add_argument("--records", type=int, default=None, help="cap on stdlib corpus records")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="writer-overhead rounds")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-litdata", action="store_true")
    args = parser.parse_args(argv)
    machine = machine_stamp()  # the load the run starts under
    work = Path(tempfile.mkdtemp(prefix="bench_preprocess_"))
    try:
        src = work / "stdlib_chat.jsonl"
        n = corpus(src, args.records, args.copies)
        size = src.stat().st_size
        print(f"corpus: {n} records, {size / 1e6:.1f} MB", file=sys.stderr)
        pre = bench_preprocess(src, work, SHARDS, keep=True)
        parts = bench_parts(src, work, args.parts, not args.no_ray)
        naive = naive_pipeline(src, work)
        ids, sources, _, _ = tokenized(src)
        writers = bench_writers(ids, sources, work, args.repeats)
        lit = "left out: --no-litdata" if args.no_litdata else bench_litdata(src, work)
        annotated = bench_annotate(work, args.parts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {
        "note": "one run, every ratio from this run; machine.load_average is the load at its "
        "start, load_average_at_end the load when it ended",
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "corpus": {"records": n, "bytes": size, "source": f"stdlib chat corpus x{args.copies}"},
        "preprocess": pre,
        "parts": parts,
        "stock": {
            "naive_mds_loop": {"records": n, **_rate(n, size, naive["seconds"])},
            "litdata_optimize": lit,
        },
        "writer_overhead": {
            k: writers[k] for k in ("ratio_mds", "ratio_wds", "target_ratio", "seconds_median")
        },
        "annotate": annotated,
        "scaling_efficiency_2_workers": {
            "preprocess_mds": _efficiency(pre, "workers", format="mds"),
            "preprocess_wds": _efficiency(pre, "workers", format="wds"),
            "annotate_mds": _efficiency(annotated, "workers", format="mds", parts=1),
            "annotate_wds": _efficiency(annotated, "workers", format="wds", parts=1),
            "litdata": _efficiency(lit, "workers") if isinstance(lit, list) else None,
            "target": 0.8,
        },
    }
    write_result(result, args.out, machine=machine)
    for row in pre:
        print(
            f"preprocess {row['format']} workers={row['workers']}: {row['records_per_s']:.0f} rec/s {row['mb_per_s']:.2f} MB/s stages {row['stages_s']}"
        )
    for row in parts:
        print(
            f"parts {row['engine']} {row['format']} x{row['parts']}: {row['records_per_s']:.0f} rec/s"
        )
    for row in annotated:
        print(
            f"annotate {row['format']} workers={row['workers']} parts={row['parts']}: {row['records_per_s']:.0f} rec/s"
        )
    print(
        f"stock naive loop: {result['stock']['naive_mds_loop']['records_per_s']:.0f} rec/s; litdata: {lit}"
    )
    print(
        f"writer overhead MDS {writers['ratio_mds']:.3f}; scaling {result['scaling_efficiency_2_workers']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
