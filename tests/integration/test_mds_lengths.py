"""Token counts read from raw MDS bytes (``bcl_stream.formats.mds_lengths``) equal what
streaming's own reader decodes, for every encoding the fast path takes, with other columns
before and after the counted one; encodings it does not take fall back (None). And
``annotate`` of a dataset our writer made runs without importing streaming (issue point 12).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_process import python_process

from bcl_stream.formats.mds_lengths import shard_counts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


def write(root: Path, columns: dict[str, str], make: object, n: int = 150) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(root), columns=columns, size_limit=2048) as writer:
        for i in range(n):
            writer.write(make(i))  # type: ignore[operator]


def decoded(root: Path, field: str, as_length: bool) -> list[int]:
    from streaming.base.format import reader_from_json

    out: list[int] = []
    for shard in json.loads((root / "index.json").read_text())["shards"]:
        reader = reader_from_json(str(root), None, shard)
        for i in range(shard["samples"]):
            value = reader.get_item(i)[field]
            out.append(int(value) if as_length else len(value))
    return out


def fast(root: Path, field: str, as_length: bool) -> list[int | None]:
    out: list[int | None] = []
    for shard in json.loads((root / "index.json").read_text())["shards"]:
        counts = shard_counts(root / shard["raw_data"]["basename"], shard, field, as_length)
        out += counts if counts is not None else [None]
    return out


def length(i: int) -> int:
    return 1 + (i * 37) % 300  # up to 300: shape values need 2 bytes above 255


CASES = {
    "ndarray_uint32": ({"input_ids": "ndarray:uint32"}, np.uint32),
    "ndarray_int64_between_columns": (
        {"source": "str", "input_ids": "ndarray:int64", "n": "int"},
        np.int64,
    ),
    "ndarray_dynamic_dtype": ({"text": "str", "input_ids": "ndarray"}, np.int32),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_counts_equal_decoded_counts(case: str, tmp_path: Path) -> None:
    columns, dtype = CASES[case]

    def make(i: int) -> dict[str, object]:
        sample: dict[str, object] = {"input_ids": np.arange(length(i), dtype=dtype)}
        sample.update({k: f"record {i}" for k, v in columns.items() if v == "str"})
        sample.update({k: i for k, v in columns.items() if v == "int"})
        return sample

    write(tmp_path / "ds", columns, make)
    want = decoded(tmp_path / "ds", "input_ids", False)
    assert want == [length(i) for i in range(150)]
    assert fast(tmp_path / "ds", "input_ids", False) == want


@pytest.mark.parametrize("encoding", ["int", "uint32", "int16"])
def test_fast_length_column_equals_decoded(encoding: str, tmp_path: Path) -> None:
    columns = {"text": "str", "n_tokens": encoding}
    write(tmp_path / "ds", columns, lambda i: {"text": "x" * (i % 7), "n_tokens": length(i)})
    want = decoded(tmp_path / "ds", "n_tokens", True)
    assert fast(tmp_path / "ds", "n_tokens", True) == want


def test_other_encodings_fall_back(tmp_path: Path) -> None:
    write(tmp_path / "ds", {"input_ids": "pkl"}, lambda i: {"input_ids": list(range(length(i)))})
    assert set(fast(tmp_path / "ds", "input_ids", False)) == {None}
    assert set(fast(tmp_path / "ds", "missing", False)) == {None}


def test_annotate_does_not_import_streaming(mds_dir: Path, tmp_path: Path) -> None:
    import shutil

    from bcl_stream.io.index import read_index

    plain = tmp_path / "plain"
    shutil.copytree(mds_dir, plain)
    for name in ("bcl_index.json", "bcl_costs.npy"):
        (plain / name).unlink()
    code = (
        "import sys; from bcl_stream.cli import main; "
        f"code = main(['annotate', {str(plain)!r}, '--no-progress', '--cost-model', 'tokens']); "
        "print(code, 'streaming' in sys.modules, 'torch' in sys.modules)"
    )
    proc = python_process(code)
    assert proc.stdout.strip().splitlines()[-1] == "0 False False", proc.stderr[-2000:]
    assert read_index(plain).tokens.tolist() == read_index(mds_dir).tokens.tolist()
