"""Loader benchmark: plan-following readers against stock iteration, and memory vs size.

Throughput: in one process, alternating runs (best of ``--repeats``), records/s of
- MDS: ``MDSPackDataset`` (rank 0 of ``--world-size``, scopes rank/node/world) against plain
  ``StreamingDataset`` iteration (shuffle off) over the same shards;
- WebDataset: ``WDSPackDataset`` (scope rank) against plain ``wds.WebDataset(...).decode()``.
Both sides run with ``num_workers=0`` so the ratio measures the reader's own per-record cost.
Target: ratio >= 0.9 everywhere.

Memory: a child process per dataset size builds the MDS reader and reads a fixed number of
packs; its peak RSS (``ru_maxrss``) is compared between sizes (100K vs 1M records; ``--quick``:
20K vs 200K) together with the cost index size, to see what grows with the dataset.

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
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


def plain_mds(root: Path, limit: int) -> int:
    """Stock StreamingDataset iteration (shuffle off), the first ``limit`` records."""
    from streaming import StreamingDataset

    count = 0
    for sample in StreamingDataset(local=str(root), shuffle=False, batch_size=1):
        count += sample["input_ids"].size > 0
        if count == limit:
            break
    return count


def raw_getitem(dataset: Any, limit: int) -> int:
    """The floor under our MDS reader: ``StreamingDataset.get_item`` in a bare loop over the
    same records our reader yields (no plan, no loader, no dict copy)."""
    count = 0
    for sid in dataset.rank_packs().ravel()[:limit]:
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


def ours(dataset: Any) -> int:
    from bcl_stream.loader import PackLoader

    dataset.set_epoch(0)
    count = 0
    for pack in PackLoader(dataset):
        count += sum(s["input_ids"].size > 0 for s in pack)
    return count


def throughput(
    mds: Path, wds_root: Path, world: int, repeats: int, plain_limit: int
) -> list[dict[str, Any]]:
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.formats.wds_reader import WDSPackDataset
    from bcl_stream.plan_source import ReaderConfig, _plan_one

    cases: list[tuple[str, str, Any]] = []
    for scope in ("rank", "node", "world"):
        config = ReaderConfig(
            world_size=world, ranks_per_node=world // 2, pack_size=8, window=16, scope=scope
        )
        cases.append(("mds", scope, MDSPackDataset(mds, config, 0)))
    config = ReaderConfig(world_size=world, pack_size=8, window=16)
    cases.append(("wds", "rank", WDSPackDataset(wds_root, config, 0)))
    rows = []
    for fmt, scope, dataset in tqdm(cases, desc="throughput"):
        start = time.perf_counter()
        _plan_one(dataset.index, dataset.config, 0, np.empty(0, np.int64))
        plan_seconds = time.perf_counter() - start
        dataset.plan(0)  # planned once per epoch per process, as a worker does
        # Stock reader over the same number of records, interleaved with ours (best of
        # ``repeats`` each) so machine load hits both sides alike.
        limit = min(dataset.rank_packs().size, plain_limit)
        sides: dict[str, Any] = {"ours": lambda d=dataset: ours(d)}
        if fmt == "mds":
            sides["plain"] = lambda n=limit: plain_mds(mds, n)
            sides["raw"] = lambda d=dataset, n=limit: raw_getitem(d, n)
        else:
            sides["plain"] = lambda n=limit: plain_wds(wds_root, n)
        rates = {side: 0.0 for side in sides}
        counts = {side: 0 for side in sides}
        for _ in range(repeats):
            for side, fn in sides.items():
                counts[side], seconds = timed(fn)
                rates[side] = max(rates[side], counts[side] / seconds)
        n_ours, ours_rate = counts["ours"], rates["ours"]
        n_plain, plain_rate = counts["plain"], rates["plain"]
        raw_rate = rates.get("raw", float("nan"))
        rows.append(
            {
                "format": fmt,
                "scope": scope,
                "world_size": world,
                "records_read": n_ours,
                "records_read_plain": n_plain,
                "ours_records_per_s": round(ours_rate, 1),
                "plain_records_per_s": round(plain_rate, 1),
                "ratio": round(ours_rate / plain_rate, 3),
                "raw_get_item_records_per_s": None if fmt == "wds" else round(raw_rate, 1),
                "ratio_vs_raw_get_item": None if fmt == "wds" else round(ours_rate / raw_rate, 3),
                "plan_seconds": round(plan_seconds, 3),
            }
        )
    return rows


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
    from bcl_stream.loader import PackLoader
    from bcl_stream.plan_source import ReaderConfig

    proc = psutil.Process()
    gc.collect()
    base = proc.memory_info().rss / 2**20
    config = ReaderConfig(world_size=8, ranks_per_node=8, pack_size=8, window=16, scope="node")
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

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    rows = result["throughput"]
    labels = [f"{r['format']}\n{r['scope']}" for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [r["ratio"] for r in rows], 0.4, label="vs stock iteration")
    strict = [r["ratio_vs_raw_get_item"] or 0.0 for r in rows]
    ax1.bar(x + 0.2, strict, 0.4, label="vs bare get_item loop (MDS)")
    ax1.axhline(0.9, color="tab:red", linestyle="--", label="target 0.9")
    ax1.set_xticks(x, labels)
    ax1.set_yscale("log")
    ax1.set_ylabel("records/s ratio: ours / baseline")
    ax1.set_title("Reader throughput (num_workers=0)")
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
        "num_workers": 0,
        "repeats": repeats,
        "throughput": throughput(mds, wds_root, 4, repeats, 5_000 if args.quick else 20_000),
        "memory": memory(args.cache, sizes, 200 if args.quick else 1000),
    }
    result["throughput_target_met"] = all(r["ratio"] >= 0.9 for r in result["throughput"])
    mem = result["memory"]
    result["reader_rss_growth_mb"] = round(
        mem[-1]["reader_rss_high_mb"] - mem[0]["reader_rss_high_mb"], 1
    )
    result["index_growth_mb"] = round(mem[-1]["index_mb"] - mem[0]["index_mb"], 2)
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
