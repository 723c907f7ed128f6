"""Cost index benchmark: open + verify time and process memory for 1M, 10M and 100M records.

Each size is a synthetic ``bcl_costs.npy`` + ``bcl_index.json`` written chunk by chunk to a
temporary directory (100M records: an 800 MB file). A fresh child process per (size, mode)
opens it and reports, from ``/proc/self/status``, how its memory grew:

- ``RssAnon``: private memory, what a process pays that no other process can share;
- ``RssFile``: pages of mapped files resident in this process (shared through the page cache
  by every process of a node, and dropped by the kernel under memory pressure);
- ``VmHWM``: the peak RSS, so a temporary copy freed before the measurement still shows.

Modes: ``mapped`` (``read_index`` as it is: ``np.memmap`` + chunked hash reads) and
``in_memory`` (what it did before: ``np.load`` of the whole array + one SHA-256 over it), each
followed by the stored costs and token counts of 1M random ids (what planning gathers).
The page cache is warm (the file was just written); a cold open adds the disk read.

Writes ``results/bench_index.json`` and ``results/bench_index.png``.
Usage: ``python tools/bench_index.py [--quick]`` (quick: 1M and 10M only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.harness import RESULTS, bench_parser, checkout_env, write_result
from bcl_stream.cost import get_preset
from bcl_stream.io.index import COST_DTYPE, COSTS_NPY, INDEX_JSON, read_index, read_index_json
from bcl_stream.io.index_meta import seal

CHUNK = 1 << 22
GATHER = 1_000_000


def write_synthetic(root: Path, n: int) -> None:
    """A valid cost index of ``n`` records with skewed lengths, never whole in memory."""
    model = get_preset("llama3-8b")
    rng = np.random.default_rng(n)
    records = np.lib.format.open_memmap(root / COSTS_NPY, mode="w+", dtype=COST_DTYPE, shape=(n,))
    digest = hashlib.sha256()
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        tok = np.clip(rng.lognormal(5.0, 1.0, size), 1, 32768).astype(np.uint32)
        part = records[start : start + size]
        part["tokens"] = tok
        part["cost"] = model.cost(tok)
        part["trained"] = tok - 1  # no masks: every target trained
        digest.update(np.ascontiguousarray(part).view(np.uint8).data)
    records.flush()
    del records
    per_shard = 100_000
    shards = [
        {"name": f"shard.{i:06d}.mds", "samples": min(per_shard, n - i * per_shard)}
        for i in range((n + per_shard - 1) // per_shard)
    ]
    meta = {
        "format": "mds",
        "records": n,
        "cost_model": model.to_dict(),
        "shards": shards,
        "sha256": digest.hexdigest(),
        "costs_file": COSTS_NPY,
    }
    (root / INDEX_JSON).write_text(json.dumps(seal(meta)))


def status() -> dict[str, int]:
    """Memory fields of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def child(root: str, mode: str) -> None:
    """Open the index in ``mode``, gather 1M random ids, print one JSON line."""
    ids = np.sort(np.random.default_rng(0).integers(0, read_index_json(root)["records"], GATHER))
    before = status()
    start = time.perf_counter()
    if mode == "mapped":
        index = read_index(root, verify=True)
        records = index.records
    else:  # the previous read path: the whole array in memory, hashed in one call
        records = np.load(Path(root) / COSTS_NPY, allow_pickle=False)
        ok = (
            hashlib.sha256(records.view(np.uint8).data).hexdigest()
            == read_index_json(root)["sha256"]
        )
        assert ok, "hash mismatch"
    open_s = time.perf_counter() - start
    opened = status()
    start = time.perf_counter()
    if mode == "mapped":
        costs, tokens = index.costs(), index.tokens
    else:
        costs, tokens = records["cost"].astype(np.float64), records["tokens"]
    picked = float(np.asarray(costs[ids], np.float64).sum() + tokens[ids].sum())
    gather_s = time.perf_counter() - start
    gathered = status()
    no_verify_s = None
    if mode == "mapped":
        start = time.perf_counter()
        read_index(root, verify=False)
        no_verify_s = time.perf_counter() - start

    def grown(now: dict[str, int]) -> dict[str, float]:
        mb = {k: round((now[k] - before[k]) / 2**20, 1) for k in ("VmRSS", "RssAnon", "RssFile")}
        mb["peak_over_start"] = round((now["VmHWM"] - before["VmRSS"]) / 2**20, 1)
        return mb

    print(
        json.dumps(
            {
                "mode": mode,
                "records": len(records),
                "file_mb": round(records.nbytes / 2**20, 1),
                "open_verify_s": round(open_s, 4),
                "open_no_verify_s": None if no_verify_s is None else round(no_verify_s, 5),
                "gather_1m_s": round(gather_s, 4),
                "mb_after_open": grown(opened),
                "mb_after_gather": grown(gathered),
                "checksum": picked,
            }
        )
    )


def measure(root: Path, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), "--mode", mode],
        capture_output=True,
        text=True,
        env=checkout_env(),
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["records"] for r in rows})
    labels = [f"{n / 1e6:g}M" for n in sizes]
    x = np.arange(len(sizes))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for offset, mode in ((-0.2, "in_memory"), (0.2, "mapped")):
        got = {r["records"]: r for r in rows if r["mode"] == mode}
        ax1.bar(x + offset, [got[n]["open_verify_s"] for n in sizes], 0.4, label=mode)
        ax2.bar(x + offset, [got[n]["mb_after_gather"]["RssAnon"] for n in sizes], 0.4, label=mode)
    ax2.plot(x, [n * 8 / 2**20 for n in sizes], "k_", markersize=30, label="index size")
    ax1.set(xticks=x, xticklabels=labels, ylabel="seconds", title="open + verify (warm cache)")
    ax2.set(xticks=x, xticklabels=labels, ylabel="MB", title="private RSS growth (RssAnon)")
    ax2.set_yscale("symlog")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_index.json", quick="1M and 10M records only")
    parser.add_argument("--tmp", type=Path, default=None, help="where the indexes are written")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="mapped", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.mode)
        return 0
    sizes = [1_000_000, 10_000_000] + ([] if args.quick else [100_000_000])
    started = time.perf_counter()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="bcl_bench_index_", dir=args.tmp))
    try:
        for n in sizes:
            root = work / str(n)
            root.mkdir()
            write_synthetic(root, n)
            for mode in ("in_memory", "mapped"):
                rows.append(measure(root, mode))
                print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mapped = [r for r in rows if r["mode"] == "mapped"]
    result = {
        "mode": "quick" if args.quick else "full",
        "gathered_ids": GATHER,
        "rows": rows,
        "mapped_max_private_growth_mb": max(r["mb_after_gather"]["RssAnon"] for r in mapped),
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_result(result, args.out, lambda written, png: plot(written["rows"], png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
