"""Loader benchmark: our readers against stock loaders configured as their users do, and
reader memory against dataset size.

Throughput (MDS), records/s of one process reading a whole epoch (world size 1), each side
through a torch ``DataLoader`` with the same ``num_workers`` (0 and 2), best of ``--repeats``
runs interleaved so that machine load hits both sides alike:
- ours: ``MDSPackDataset`` + ``PackLoader`` (packs of B records);
- stock: ``StreamingDataset(batch_size=B, shuffle=True)`` in ``DataLoader(batch_size=B)``, the
  way streaming's users configure it (``batch_size`` sets its predownload and worker split; a
  stock ``batch_size=1`` predownloads 8 samples and polls every 7 ms, ~1.1K records/s, which
  only measures that polling). Both sides collate to a list of record dicts.
Sources: the local directory, and the same shards as ``s3://`` on a moto server (a separate
process on 127.0.0.1) with a fresh cache directory per run, so every run downloads.
The bare ``StreamingDataset.get_item`` loop over our ids (local, in process) is the floor.

WebDataset: ``WDSPackDataset`` against stock ``wds.WebDataset(...).decode()``, in process.

Memory: a child process per dataset size builds the MDS reader and reads a fixed number of
packs; its RSS while reading is compared between sizes (100K vs 1M records; ``--quick``:
10K vs 100K) together with the cost index size, to see what grows with the dataset.

Writes ``results/bench_loader.json`` and ``results/bench_loader.png``.
Usage: ``python tools/bench_loader.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from result_files import write_result  # noqa: E402


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


def timed(fn: Any) -> tuple[int, float]:
    start = time.perf_counter()
    count = fn()
    return count, time.perf_counter() - start


B = 8
"""Records per pack, and the stock loader's ``batch_size``."""


def as_list(batch: Any) -> Any:
    """Both sides' collate: the batch stays a list of record dicts (module level: picklable)."""
    return batch


def stock_mds(source: str, cache: Path | None, workers: int) -> int:
    """Stock ``StreamingDataset`` as its users configure it: ``batch_size`` = the micro-batch,
    shuffled, read through a DataLoader with ``workers`` workers."""
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    kwargs: dict[str, Any] = {"shuffle": True, "batch_size": B}
    if cache is None:
        kwargs["local"] = source
    else:
        kwargs.update(remote=source, local=str(cache))
    dataset = StreamingDataset(**kwargs)
    count = 0
    for batch in DataLoader(dataset, batch_size=B, num_workers=workers, collate_fn=as_list):
        count += sum(s["input_ids"].size > 0 for s in batch)
    return count


def ours_mds(source: str, cache: Path | None, workers: int) -> int:
    """``MDSPackDataset`` + ``PackLoader``: the whole epoch of a one-rank world."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    config = ReaderConfig.build(world_size=1, pack_size=B, window=16)
    dataset = MDSPackDataset(source, config, 0, cache_dir=cache)
    count = 0
    for pack in PackLoader(dataset, num_workers=workers, collate_fn=as_list):
        count += sum(s["input_ids"].size > 0 for s in pack)
    return count


def raw_getitem(source: str) -> int:
    """The floor under our MDS reader: ``StreamingDataset.get_item`` in a bare loop over the
    ids our reader yields (no plan lookups, no loader, no checks)."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.mds_reader import MDSPackDataset

    dataset = MDSPackDataset(source, ReaderConfig.build(world_size=1, pack_size=B, window=16), 0)
    count = 0
    for sid in dataset.rank_packs().ravel():
        count += dataset.streaming.get_item(int(sid))["input_ids"].size > 0
    return count


def plain_wds(root: Path, limit: int) -> int:
    """Stock ``wds.WebDataset(urls).decode()`` iteration, the first ``limit`` records."""
    import webdataset as wds

    urls = sorted(str(p) for p in root.glob("*.tar"))
    count = 0
    for sample in wds.WebDataset(urls, shardshuffle=False).decode():
        count += sample["input_ids.npy"].size > 0
        if count == limit:
            break
    return count


def ours_wds(root: Path) -> int:
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.wds_reader import WDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    dataset = WDSPackDataset(root, ReaderConfig.build(world_size=4, pack_size=B, window=16), 0)
    return sum(sum(s["input_ids"].size > 0 for s in pack) for pack in PackLoader(dataset))


class MotoServer:
    """``moto_server`` on 127.0.0.1 in its own process (in this process it would take the GIL
    from the reader it serves); the dataset is uploaded to ``s3://bench/mds``."""

    def __init__(self, root: Path) -> None:
        import os
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
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(
            S3_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
        )
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(100):
            try:
                client.create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.1)
        for path in sorted(root.iterdir(), key=lambda p: p.name == "index.json"):
            client.upload_file(str(path), "bench", f"mds/{path.name}")
        self.url = "s3://bench/mds"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def throughput(mds: Path, wds_root: Path, repeats: int, cache: Path) -> list[dict[str, Any]]:
    """Records/s of ours and stock, local and S3, 0 and 2 workers (best of ``repeats``)."""
    import shutil

    server = MotoServer(mds)
    rows = []
    runs = 0

    def fresh() -> Path:
        nonlocal runs
        runs += 1
        path = cache / f"s3cache_{runs}"
        shutil.rmtree(path, ignore_errors=True)
        return path

    try:
        cases = [(src, k) for src in ("local", "s3") for k in (0, 2)]
        for src, workers in tqdm(cases, desc="throughput"):
            source = str(mds) if src == "local" else server.url
            sides: dict[str, Any] = {
                "ours": lambda s=source, k=workers, r=src: ours_mds(
                    s, None if r == "local" else fresh(), k
                ),
                "stock": lambda s=source, k=workers, r=src: stock_mds(
                    s, None if r == "local" else fresh(), k
                ),
            }
            if src == "local" and workers == 0:
                sides["raw"] = lambda s=source: raw_getitem(s)
            rows.append(compare("mds", src, workers, sides, repeats))
    finally:
        server.close()
    limit = 20_000
    sides = {"ours": lambda: ours_wds(wds_root), "stock": lambda: plain_wds(wds_root, limit)}
    rows.append(compare("wds", "local", 0, sides, repeats))
    return rows


def compare(
    fmt: str, source: str, workers: int, sides: dict[str, Callable[[], int]], repeats: int
) -> dict[str, Any]:
    """One throughput row: ``ours`` against ``stock`` (and ``raw`` get_item when given) on the
    same data, each side's best records/s over ``repeats`` rounds. The sides alternate within a
    round, so a slowdown of the shared machine hits them alike."""
    rates = {side: 0.0 for side in sides}
    counts = {side: 0 for side in sides}
    for _ in range(repeats):
        for side, fn in sides.items():
            counts[side], seconds = timed(fn)
            rates[side] = max(rates[side], counts[side] / seconds)
    row: dict[str, Any] = {
        "format": fmt,
        "source": source,
        "num_workers": workers,
        "batch_size": B,
        "records_ours": counts["ours"],
        "records_stock": counts["stock"],
        "ours_records_per_s": round(rates["ours"], 1),
        "stock_records_per_s": round(rates["stock"], 1),
        "ratio": round(rates["ours"] / rates["stock"], 3),
    }
    if "raw" in rates:
        row["raw_get_item_records_per_s"] = round(rates["raw"], 1)
        row["ratio_vs_raw_get_item"] = round(rates["ours"] / rates["raw"], 3)
    return row


def rss_child(root: str, packs: int) -> None:
    """Child mode: build the reader, read ``packs`` packs, print RSS figures (MB) as JSON.

    ``ru_maxrss`` is set by the imports (torch, streaming, transformers: ~700 MB) and hides
    the reader, so the figure that matters is the current RSS sampled while reading, minus the
    RSS after imports.
    """
    import gc

    import psutil
    import streaming  # noqa: F401  (imported up front: ~200 MB that is not the reader's)

    from bcl_stream.epoch.plan import ReaderConfig
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
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["throughput"]
    labels = [f"{r['format']} {r['source']}\n{r['num_workers']} workers" for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [r["ours_records_per_s"] for r in rows], 0.4, label="ours")
    ax1.bar(x + 0.2, [r["stock_records_per_s"] for r in rows], 0.4, label="stock")
    for i, r in enumerate(rows):
        top = max(r["ours_records_per_s"], r["stock_records_per_s"])
        ax1.text(i, top * 1.02, f"{r['ratio']:.2f}x", ha="center", fontsize=8)
    ax1.set_xticks(x, labels, fontsize=8)
    ax1.set_ylabel("records/s")
    ax1.set_title(f"Throughput, B={rows[0]['batch_size']} (stock: batch_size=B)")
    ax1.legend(fontsize=8)
    mem = result["memory"]
    names = [f"{m['records']:,}" for m in mem]
    ax2.bar(names, [m["reader_rss_high_mb"] for m in mem], color="tab:green", label="reader RSS")
    ax2.plot(names, [m["index_mb"] for m in mem], "ko-", label="cost index size")
    ax2.set_ylabel("MB above the RSS after imports")
    ax2.legend()
    ax2.set_title(f"Reader memory while reading {mem[0]['packs_read']} packs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/bcl_bench_loader"))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_loader.json")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--packs", type=int, default=500, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.packs)
        return 0
    n = 20_000 if args.quick else 100_000
    sizes = [10_000, 100_000] if args.quick else [100_000, 1_000_000]
    repeats = args.repeats or (2 if args.quick else 3)
    args.cache.mkdir(parents=True, exist_ok=True)
    mds = build("mds", args.cache / f"mds_{n}", n)
    wds_root = build("wds", args.cache / f"wds_{n}", n)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "records": n,
        "repeats": repeats,
        "throughput": throughput(mds, wds_root, repeats, args.cache),
        "memory": memory(args.cache, sizes, 200 if args.quick else 1000),
    }
    rows = result["throughput"]
    result["target_ours_vs_stock_met"] = all(r["ratio"] >= 1.0 for r in rows)
    rate = {
        (r["source"], r["num_workers"]): r["ours_records_per_s"]
        for r in rows
        if r["format"] == "mds"
    }
    result["workers_2_over_0"] = {
        src: round(rate[(src, 2)] / rate[(src, 0)], 3) for src in ("local", "s3")
    }
    result["target_2_workers_not_slower_met"] = all(
        v >= 1.0 for v in result["workers_2_over_0"].values()
    )
    mem = result["memory"]
    result["reader_rss_growth_mb"] = round(
        mem[-1]["reader_rss_high_mb"] - mem[0]["reader_rss_high_mb"], 1
    )
    result["index_growth_mb"] = round(mem[-1]["index_mb"] - mem[0]["index_mb"], 2)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_result(result, args.out, plot)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
