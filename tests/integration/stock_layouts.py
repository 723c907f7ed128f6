"""Datasets as other tools write them, with the stock writers (no bcl-stream code): Mosaic
Streaming's ``MDSWriter`` in llm-foundry's layouts and webdataset's ``ShardWriter``.

- ``foundry_tokens``: llm-foundry's ``convert_dataset_hf --concat_tokens``: a ``tokens`` column
  of raw ``int64`` bytes (``np.int64 ids .tobytes()``), plus an integer length column ``n``;
- ``foundry_text``: llm-foundry's text layout, one ``str`` column ``text``;
- ``wds_tokens``: ``<key>.tokens.npy`` (int32 ids) and a ``<key>.json`` with ``{"n": length}``;
- ``wds_text``: ``<key>.txt`` only.

Record ``i``'s text is ``"w{i} " * k`` plus a tail, and its ids are ``i`` repeated, so a test
can tell which record it got. Kept free of pytest so scripts can import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYOUTS = ("foundry_tokens", "foundry_text", "wds_tokens", "wds_text")


def lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(3, 60, n)


def text(i: int, k: int) -> str:
    return f"record {i}: " + "lorem ipsum " * int(k)


def write(layout: str, out: Path, n: int = 160) -> Path:
    """Write ``n`` records in ``layout`` under ``out`` with the stock writer; returns ``out``."""
    sizes = lengths(n)
    if layout.startswith("foundry"):
        from streaming import MDSWriter

        columns = {"tokens": "bytes", "n": "int"} if layout == "foundry_tokens" else {"text": "str"}
        with MDSWriter(out=str(out), columns=columns, size_limit=1 << 12) as writer:
            for i, k in enumerate(sizes):
                if layout == "foundry_tokens":
                    ids = np.full(int(k), i, dtype=np.int64)
                    writer.write({"tokens": ids.tobytes(), "n": int(k)})
                else:
                    writer.write({"text": text(i, k)})
        return out
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    pattern = str(out / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=40, verbose=0) as sink:
        for i, k in enumerate(sizes):
            key = f"{i:06d}"
            if layout == "wds_tokens":
                sink.write(
                    {
                        "__key__": key,
                        "tokens.npy": np.full(int(k), i, dtype=np.int32),
                        "json": {"n": int(k)},
                    }
                )
            else:
                sink.write({"__key__": key, "txt": text(i, k)})
    return out
