"""Parts of a partitioned run: every record in exactly one part, in order, named as a whole
run names it; parts balanced by bytes; merge refuses incomplete splits (names only)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bcl_stream.errors import DatasetError
from bcl_stream.preprocess.merge import select_parts
from bcl_stream.preprocess.parts import Part, input_slices, shard_span
from bcl_stream.preprocess.sources import read_records


def _jsonl(path: Path, n: int, seed: int, blank_every: int = 0) -> str:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"text": "w " * ((i * 7 + seed) % 23 + 1), "i": i}) + "\n")
            if blank_every and i % blank_every == 0:
                fh.write("\n")
    return str(path)


def _parquet(path: Path, n: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [f"row {i} " * (i % 5 + 1) for i in range(n)]})
    pq.write_table(table, path, row_group_size=7)
    return str(path)


def _layouts(tmp: Path) -> dict[str, list[str]]:
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    return {
        "one_big_file": [_jsonl(tmp / "big.jsonl", 301, 0, blank_every=13)],
        "many_small": [_jsonl(tmp / f"s{i}.jsonl", 3 + i, i) for i in range(9)],
        "mixed": [
            _jsonl(tmp / "a.jsonl", 40, 1),
            _parquet(tmp / "p.parquet", 53),
            _jsonl(tmp / "b.jsonl", 150, 2, blank_every=4),
        ],
        "empty_inside": [_jsonl(tmp / "c.jsonl", 30, 3), str(empty), _jsonl(tmp / "d.jsonl", 9, 4)],
    }


def _read(inputs: list[str], part: Part | None) -> tuple[list[str], Counter[str], list[str]]:
    counts: Counter[str] = Counter()
    empty: list[str] = []
    pieces = list(inputs) if part is None else input_slices(inputs, part)
    sources = [source for source, _ in read_records(pieces, counts, empty)]
    return sources, counts, empty


@pytest.mark.parametrize("layout", ["one_big_file", "many_small", "mixed", "empty_inside"])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 64])
def test_parts_hold_every_record_once_in_order(tmp_path: Path, layout: str, count: int) -> None:
    inputs = _layouts(tmp_path)[layout]
    whole, whole_counts, whole_empty = _read(inputs, None)
    joined: list[str] = []
    counts: Counter[str] = Counter()
    empty: list[str] = []
    for i in range(count):
        sources, part_counts, part_empty = _read(inputs, Part(i, count))
        joined += sources
        counts += part_counts
        empty += part_empty
    assert joined == whole  # every record once, in order, with the same file:line names
    assert counts == whole_counts  # bytes read, blank lines: every byte in one part
    assert empty == whole_empty  # an empty file is reported by exactly one part


def test_parts_are_balanced_by_bytes(tmp_path: Path) -> None:
    inputs = [_jsonl(tmp_path / "big.jsonl", 4000, 0), _jsonl(tmp_path / "small.jsonl", 50, 1)]
    sizes = [_read(inputs, Part(i, 4))[1]["bytes_read"] for i in range(4)]
    longest = max(map(len, Path(inputs[0]).read_bytes().splitlines(keepends=True)))
    assert max(sizes) - min(sizes) <= 2 * longest


def test_empty_input_is_an_error_in_the_part_that_owns_it(tmp_path: Path) -> None:
    inputs = _layouts(tmp_path)["empty_inside"]
    errors = 0
    for i in range(3):
        pieces = input_slices(inputs, Part(i, 3))
        try:
            list(read_records(pieces, Counter()))
        except DatasetError as exc:
            assert "empty.jsonl: empty input" in str(exc)
            errors += 1
    assert errors == 1


@pytest.mark.parametrize("text", ["3", "4/4", "-1/4", "a/b", "1/0"])
def test_bad_part_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="part"):
        Part.parse(text)


@pytest.mark.parametrize("shards,count", [(10, 3), (3, 5), (100, 7), (1, 1)])
def test_shard_spans_cover_every_shard_once(shards: int, count: int) -> None:
    spans = [shard_span(shards, Part(i, count)) for i in range(count)]
    assert [s for span in spans for s in span] == list(range(shards))
    assert max(map(len, spans)) - min(map(len, spans)) <= 1


def test_select_parts_names_what_is_missing_or_mixed() -> None:
    assert select_parts("o", ["part-1-of-2", "part-0-of-2", "x"]) == [Part(0, 2), Part(1, 2)]
    with pytest.raises(DatasetError, match=r"1 of 3 parts missing \(part-1-of-3\).*--part 1/3"):
        select_parts("o", ["part-0-of-3", "part-2-of-3"])
    with pytest.raises(DatasetError, match="different splits"):
        select_parts("o", ["part-0-of-2", "part-1-of-2", "part-0-of-3"])
    with pytest.raises(DatasetError, match="no part directories"):
        select_parts("o", ["index.json"])


@pytest.mark.parametrize(
    "extra,given",
    [
        (["--parts", "2"], "--parts without --engine ray"),
        (["--engine", "ray"], "--engine ray without --parts N"),
        (["--engine", "ray", "--parts", "2", "--part", "0/2"], "--part with --engine ray"),
    ],
)
def test_cli_refuses_mixed_part_options_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], given: str
) -> None:
    from bcl_stream.cli import main

    assert main(["preprocess", "x.jsonl", "--output", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and given in err[0] and "--part I/N without --engine" in err[0]
