"""What the partitioned-run tests share: a small real corpus (JSONL with text and chat
records and blank lines, Parquet, a small file), writer options, and the record-for-record
comparison of a merged dataset with a single run through the stock readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bcl_stream.io.index import read_index
from bcl_stream.io.remote import download


def write_corpus(root: Path) -> list[str]:
    """A large JSONL file (text and chat records, blank lines), a Parquet file, a small one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    big = root / "big.jsonl"
    with open(big, "w") as fh:
        for i in range(400):
            if i % 3:
                fh.write(json.dumps({"text": f"record {i} " + "lorem ipsum " * (i % 37)}) + "\n")
            else:
                msgs = [
                    {"role": "user", "content": f"q{i}"},
                    {"role": "assistant", "content": "a " * (i % 29 + 1)},
                ]
                fh.write(json.dumps({"messages": msgs}) + "\n")
            if i % 50 == 0:
                fh.write("\n")
    table = pa.table({"text": [f"parquet row {i} " * (i % 11 + 1) for i in range(90)]})
    pq.write_table(table, root / "rows.parquet", row_group_size=16)
    small = root / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"small {i}"}) + "\n" for i in range(7)))
    return [str(big), str(root / "rows.parquet"), str(small)]


OPTIONS: dict[str, dict[str, Any]] = {
    "mds": {"format": "mds", "shard_size_limit": 8192},
    "wds": {"format": "wds", "maxcount": 40},
}


def stock_records(
    root: Path, fmt: str, tmp: Path, remote: str | None = None
) -> list[tuple[list[int], str]]:
    """(ids, source) of every record as the stock reader yields them, in order."""
    if fmt == "mds":
        from streaming import StreamingDataset

        ds = StreamingDataset(
            remote=remote, local=str(tmp / "cache" if remote else root), batch_size=1, shuffle=False
        )
        return [(ds[i]["input_ids"].tolist(), ds[i]["source"]) for i in range(len(ds))]
    import webdataset as wds

    index = read_index(root)
    if remote:
        urls = [str(download(f"{remote}/{s.name}", tmp / "dl" / s.name)) for s in index.shards]
    else:
        urls = [str(root / s.name) for s in index.shards]
    samples = wds.WebDataset(urls, shardshuffle=False).decode()
    return [(s["input_ids.npy"].tolist(), s["json"]["source"]) for s in samples]


def assert_same(merged: Path, single: Path, fmt: str, tmp: Path, remote: str | None = None) -> None:
    a, b = read_index(merged), read_index(single)
    assert a.records.tobytes() == b.records.tobytes()  # tokens and costs, record for record
    if fmt == "wds":
        assert a.record_hashes is not None and b.record_hashes is not None
        assert np.array_equal(a.record_hashes, b.record_hashes)
    assert a.cost_model == b.cost_model and a.extra["tokenizer"] == b.extra["tokenizer"]
    pre_a, pre_b = a.extra["preprocess"], b.extra["preprocess"]
    for key in ("records_read", "records_written", "tokens_written", "bytes_read", "blank_lines"):
        assert pre_a[key] == pre_b[key], key
    got = stock_records(merged, fmt, tmp / "merged", remote)
    want = stock_records(single, fmt, tmp / "single")
    assert len(got) == len(a) and got == want
