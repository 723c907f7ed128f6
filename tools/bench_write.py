"""Benchmark: preprocessing throughput, costed-writer overhead, cost-index size and load time.

Three measurements, written to ``results/bench_write.json`` (+ ``results/bench_write.png``):

1. ``preprocess``: end-to-end ``bcl_stream.preprocess.preprocess`` on a real chat corpus (the
   stdlib corpus from ``tools/corpora.py``: docstrings and source code as chat records), MDS and
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

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from result_files import write_result  # noqa: E402

from bcl_stream.cost import resolve  # noqa: E402
from bcl_stream.io.index import CostIndex, ShardEntry, read_index, write_index  # noqa: E402


def corpus(path: Path, limit: int | None, copies: int) -> int:
    """The stdlib chat corpus (the corpora tool's builder), concatenated ``copies`` times."""
    from corpora import build_stdlib_corpus

    once = path.with_suffix(".once.jsonl")
    build_stdlib_corpus(once, limit=limit)
    data = once.read_bytes()
    with path.open("wb") as fh:
        for _ in range(copies):
            fh.write(data)
    once.unlink()
    return sum(1 for _ in path.open("rb"))


def bench_preprocess(
    src: Path, work: Path, options: dict[str, dict[str, Any]] | None = None, keep: bool = False
) -> list[dict[str, Any]]:
    """``preprocess`` MDS and WDS with 1 and 2 workers (``options[fmt]``: writer options);
    ``keep``: leave the 1-worker outputs in ``work/pre_{fmt}_1`` (for annotate)."""
    from bcl_stream.preprocess import pipeline, preprocess

    pipeline.SMALL_INPUT_BYTES = 0  # measure the pool even on a small corpus
    size = src.stat().st_size
    rows = []
    for fmt in ("mds", "wds"):
        for workers in (1, 2):
            out = work / f"pre_{fmt}_{workers}"
            start = time.perf_counter()
            report = preprocess(
                [str(src)],
                str(out),
                workers=workers,
                overwrite=True,
                progress=False,
                **(options or {}).get(fmt, {"format": fmt}),
            )
            wall = time.perf_counter() - start
            rows.append(
                {
                    "format": fmt,
                    "workers": workers,
                    "records": report.records_written,
                    "tokens": report.tokens_written,
                    "seconds_wall": wall,
                    "seconds_pipeline": report.seconds,
                    "records_per_s": report.records_written / report.seconds,
                    "mb_per_s": size / 1e6 / report.seconds,
                    "tokens_per_s": report.tokens_written / report.seconds,
                    "seconds_parse": report.seconds_parse,
                    "seconds_tokenize": report.seconds_tokenize,
                    "stages_s": {
                        "read": report.seconds_read,
                        "parse_workers": report.seconds_parse,
                        "tokenize_workers": report.seconds_tokenize,
                        "write": report.seconds_write,
                        "finish": report.seconds_finish,
                    },
                }
            )
            if not keep or workers > 1:
                shutil.rmtree(out, ignore_errors=True)
    return rows


def tokenized(src: Path) -> tuple[list[np.ndarray], list[str], float, float]:
    """Records as the pipeline writes them; output: (ids, sources, parse s, tokenize s)."""
    from bcl_stream.preprocess.sources import record_text
    from bcl_stream.text.tokenizers import load_tokenizer

    tok = load_tokenizer("cl100k")
    start = time.perf_counter()
    texts, sources = [], []
    with src.open("rb") as fh:
        for i, line in enumerate(fh, start=1):
            text = record_text(f"{src}:{i}", line, "text")
            assert isinstance(text, str)
            texts.append(text)
            sources.append(f"{src}:{i}")
    parse = time.perf_counter() - start
    start = time.perf_counter()
    ids = [tok.ids(t) for t in texts]
    return ids, sources, parse, time.perf_counter() - start


def naive_pipeline(src: Path, work: Path) -> dict[str, float]:
    """The least a script could do: one loop, json.loads, template, tokenize, stock MDSWriter.

    No error accounting, outlier policy, progress bar, worker pool or cost index: the
    baseline our ``preprocess`` (1 worker) is compared with, tokenization timed the same way.
    """
    from streaming import MDSWriter

    from bcl_stream.text.chat import render_messages
    from bcl_stream.text.tokenizers import load_tokenizer

    tok = load_tokenizer("cl100k")
    cols = {"input_ids": "ndarray:uint32", "source": "str"}
    out = work / "naive"
    encode = 0.0
    start = time.perf_counter()
    with MDSWriter(out=str(out), columns=cols) as w, src.open("rb") as fh:
        for i, line in enumerate(fh, start=1):
            text = render_messages(json.loads(line)["messages"])
            t0 = time.perf_counter()
            ids = tok.ids(text)
            encode += time.perf_counter() - t0
            w.write({"input_ids": ids, "source": f"{src}:{i}"})
    total = time.perf_counter() - start
    shutil.rmtree(out)
    return {"seconds": total, "seconds_tokenize": encode}


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_writers(
    ids: list[np.ndarray], sources: list[str], work: Path, repeats: int
) -> dict[str, Any]:
    import webdataset as wds
    from streaming import MDSWriter

    from bcl_stream.formats.mds_writer import CostedMDSWriter
    from bcl_stream.formats.npy import npy_bytes
    from bcl_stream.formats.wds_writer import CostedWDSWriter

    cols = {"input_ids": "ndarray:uint32", "source": "str"}

    def plain_mds() -> None:
        out = work / "plain_mds"
        with MDSWriter(out=str(out), columns=cols, size_limit=1 << 26) as w:
            for a, s in zip(ids, sources, strict=True):
                w.write({"input_ids": a, "source": s})
        shutil.rmtree(out)

    def costed_mds() -> None:
        out = work / "costed_mds"
        with CostedMDSWriter(str(out), cost_model="llama3-8b", columns=cols) as w:
            for a, s in zip(ids, sources, strict=True):
                w.write({"input_ids": a, "source": s})
        shutil.rmtree(out)

    def plain_wds() -> None:
        out = work / "plain_wds"
        out.mkdir()
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=10_000, verbose=0) as w:
            for i, (a, s) in enumerate(zip(ids, sources, strict=True)):
                meta = json.dumps({"source": s, "tokens": len(a)}).encode()
                w.write({"__key__": f"{i:010d}", "input_ids.npy": npy_bytes(a), "json": meta})
        shutil.rmtree(out)

    def costed_wds() -> None:
        out = work / "costed_wds"
        with CostedWDSWriter(str(out), cost_model="llama3-8b", maxcount=10_000) as w:
            for a, s in zip(ids, sources, strict=True):
                w.write({"input_ids": a, "source": s})
        shutil.rmtree(out)

    runs: dict[str, list[float]] = {k: [] for k in ("mds", "costed_mds", "wds", "costed_wds")}
    for _ in tqdm(range(repeats), desc="writers", unit="round"):
        runs["mds"].append(_timed(plain_mds))
        runs["costed_mds"].append(_timed(costed_mds))
        runs["wds"].append(_timed(plain_wds))
        runs["costed_wds"].append(_timed(costed_wds))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "records": len(ids),
        "repeats": repeats,
        "seconds_median": med,
        "seconds_all": runs,
        "ratio_mds": med["costed_mds"] / med["mds"],
        "ratio_wds": med["costed_wds"] / med["wds"],
        "target_ratio": 1.10,
    }


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
        verified = [_timed(lambda r=root: read_index(r, verify=True)) for _ in range(repeats)]
        fast = [_timed(lambda r=root: read_index(r, verify=False)) for _ in range(repeats)]
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
    from bcl_stream.preprocess import preprocess

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=None, help="cap on stdlib corpus records")
    parser.add_argument("--copies", type=int, default=6, help="concatenate the corpus N times")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pipeline-repeats", type=int, default=3)
    parser.add_argument("--index-sizes", default="1000000,10000000")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_write.json")
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
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "note": "shared 2-core machine; medians of alternating runs",
            },
            "corpus": {
                "records": n,
                "bytes": src.stat().st_size,
                "source": f"stdlib chat corpus (tools/corpora.py) x{args.copies}",
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
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
