"""Measurements ``tools/bench_write.py`` and ``tools/bench_preprocess.py`` share: the corpus
(the stdlib chat corpus concatenated N times), ``preprocess`` per format and worker count, the
tokenized records, a naive tokenize-and-write loop, and the writers' overhead against the plain
stock writers on the same records (medians of alternating runs: the machine is shared).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_bench.corpora import build_stdlib_corpus
from bcl_stream.formats.npy import npy_bytes
from bcl_stream.formats.wds_writer import CostedWDSWriter
from bcl_stream.preprocess import pipeline, preprocess
from bcl_stream.preprocess.pipeline import PreprocessReport
from bcl_stream.preprocess.sources import record_text
from bcl_stream.text.chat import render_messages
from bcl_stream.text.tokenizers import load_tokenizer


def corpus(path: Path, limit: int | None, copies: int) -> int:
    """The stdlib chat corpus (the corpora tool's builder), concatenated ``copies`` times."""
    once = path.with_suffix(".once.jsonl")
    build_stdlib_corpus(once, limit=limit)
    data = once.read_bytes()
    with path.open("wb") as fh:
        for _ in range(copies):
            fh.write(data)
    once.unlink()
    return sum(1 for _ in path.open("rb"))


@contextmanager
def pool_always() -> Iterator[None]:
    """``preprocess`` starts its worker pool even on a small corpus, where it would encode in
    the main process: a benchmark measures the pool, not that shortcut."""
    small = pipeline.SMALL_INPUT_BYTES
    pipeline.SMALL_INPUT_BYTES = 0
    try:
        yield
    finally:
        pipeline.SMALL_INPUT_BYTES = small


def timed_preprocess(src: Path, out: Path, **options: Any) -> tuple[PreprocessReport, float]:
    """One whole ``preprocess`` of ``src`` into ``out`` (replaced) with the pool forced on
    (:func:`pool_always`): its report and its wall seconds."""
    with pool_always():
        start = time.perf_counter()
        report = preprocess([str(src)], str(out), overwrite=True, progress=False, **options)
        return report, time.perf_counter() - start


def bench_preprocess(
    src: Path, work: Path, options: dict[str, dict[str, Any]] | None = None, keep: bool = False
) -> list[dict[str, Any]]:
    """``preprocess`` MDS and WDS with 1 and 2 workers (``options[fmt]``: writer options);
    ``keep``: leave the 1-worker outputs in ``work/pre_{fmt}_1`` (for annotate)."""
    size = src.stat().st_size
    rows = []
    for fmt in ("mds", "wds"):
        for workers in (1, 2):
            out = work / f"pre_{fmt}_{workers}"
            writer = (options or {}).get(fmt, {"format": fmt})
            report, wall = timed_preprocess(src, out, workers=workers, **writer)
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


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_writers(
    ids: list[np.ndarray], sources: list[str], work: Path, repeats: int
) -> dict[str, Any]:
    import webdataset as wds
    from streaming import MDSWriter

    from bcl_stream.formats.mds_writer import CostedMDSWriter

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
        runs["mds"].append(timed(plain_mds))
        runs["costed_mds"].append(timed(costed_mds))
        runs["wds"].append(timed(plain_wds))
        runs["costed_wds"].append(timed(costed_wds))
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
