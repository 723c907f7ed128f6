"""Opening a large cost index costs almost no private memory: the array is mapped, the hash
check reads the file in chunks, and the stored costs and token counts are views.

Behaviour, not timing: a child process opens (and verifies) a 192 MB index and reports how its
RSS grew; an index loaded into memory would grow it by the file size (192 MB).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.cost import get_preset
from bcl_stream.io.index import COST_DTYPE, COSTS_NPY, INDEX_JSON
from bcl_stream.io.index_meta import seal

N_RECORDS = 16 << 20  # 192 MB of records (12 B each)
CHUNK = 1 << 20

CHILD = r"""
import json, sys
import numpy as np

def status():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields

from bcl_stream.io.index import read_index
from bcl_stream.cost import get_preset

before = status()
index = read_index(sys.argv[1], verify=True)
costs, tokens = index.costs(), index.tokens
ids = np.arange(1000, 200_000, 7)
picked = float(np.asarray(costs[ids], np.float64).sum()) + float(tokens[ids].sum())
fingerprint = index.fingerprint()
opened = status()
recomputed = index.costs(get_preset("llama3-8b"))
after_recompute = status()
print(json.dumps({"before": before, "opened": opened, "recomputed": after_recompute,
                  "records": len(index), "picked": picked, "fingerprint": fingerprint,
                  "recomputed_nbytes": int(recomputed.nbytes)}))
"""


def write_large_index(root: Path, n: int) -> None:
    """An index of ``n`` records written chunk by chunk (the test process never holds it)."""
    model = get_preset("tokens")
    records = np.lib.format.open_memmap(root / COSTS_NPY, mode="w+", dtype=COST_DTYPE, shape=(n,))
    digest = hashlib.sha256()
    for start in range(0, n, CHUNK):
        tok = (np.arange(start, min(start + CHUNK, n)) % 997 + 1).astype(np.uint32)
        part = records[start : start + tok.size]
        part["tokens"] = tok
        part["cost"] = model.cost(tok)
        digest.update(np.ascontiguousarray(part).view(np.uint8).data)
    records.flush()
    del records
    meta = {
        "format": "mds",
        "records": n,
        "cost_model": model.to_dict(),
        "shards": [{"name": f"shard.{i:05d}.mds", "samples": n // 4} for i in range(4)],
        "sha256": digest.hexdigest(),
    }
    (root / INDEX_JSON).write_text(json.dumps(seal(meta)))


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_opening_a_large_index_adds_little_memory(tmp_path: Path) -> None:
    write_large_index(tmp_path, N_RECORDS)
    size = N_RECORDS * COST_DTYPE.itemsize
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["records"] == N_RECORDS
    before, opened, recomputed = got["before"], got["opened"], got["recomputed"]
    # Opened, verified, fingerprinted, a few thousand records gathered: far below the size.
    assert opened["VmRSS"] - before["VmRSS"] < size / 8, got
    assert opened["RssAnon"] - before["RssAnon"] < size / 16, got
    # Costs under another model are the one private array: float32, 4 B/record.
    private = N_RECORDS * np.dtype(np.float32).itemsize
    assert got["recomputed_nbytes"] == private
    grown = recomputed["RssAnon"] - opened["RssAnon"]
    assert private * 0.9 < grown < private + 32 * 2**20, got
