"""Bad input to ``preprocess`` and damaged datasets: each gets a clear, named error or report."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.cli import main
from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.dataset_files import check_integrity, open_file_layout
from bcl_stream.io.index import COST_DTYPE, read_index
from bcl_stream.preprocess import preprocess

pytestmark = pytest.mark.shared_process


def _jsonl(path: Path, lines: list[bytes]) -> str:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


GOOD = [json.dumps({"text": f"record number {i} " * (i + 1)}).encode() for i in range(12)]


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [*GOOD[:4], b'{"text": "oops', *GOOD[4:]])
    with pytest.raises(DatasetError, match=rf"{src}:5: malformed JSON.*--skip-bad"):
        preprocess([src], str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out" / "index.json").exists()


def test_skip_bad_skips_counts_and_stores_the_count(tmp_path: Path) -> None:
    lines = [*GOOD[:3], b"{not json", b'{"other": 1}', b'{"text": "\xff"}', *GOOD[3:]]
    src = _jsonl(tmp_path / "in.jsonl", lines)
    report = preprocess([src], str(tmp_path / "out"), skip_bad=True, progress=False)
    expected = {"malformed_json": 1, "missing_field": 1, "undecodable": 1}
    assert report.skipped_bad == expected
    assert report.records_read == 15
    assert report.records_written == 12
    index = open_file_layout(tmp_path / "out").index
    assert len(index) == 12
    assert index.extra["preprocess"]["skipped_bad"] == expected
    assert "skipped bad records (malformed_json): 1" in report.lines()


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b'{"body": "x"}', r":3: no 'text' field, no messages .*--text-field"),
        (b'{"text": "caf\xe9"}', r":3: not valid UTF-8 at byte 13"),
        (b'{"text": ["a"]}', r":3: field 'text' is a list"),
    ],
)
def test_bad_records_are_named(tmp_path: Path, line: bytes, match: str) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [*GOOD[:2], line])
    with pytest.raises(DatasetError, match=match):
        preprocess([src], str(tmp_path / "out"), progress=False)


def test_empty_input_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match=r"empty\.jsonl: empty input"):
        preprocess([str(empty)], str(tmp_path / "out"), progress=False)
    bad_only = _jsonl(tmp_path / "bad.jsonl", [b"{", b"["])
    with pytest.raises(DatasetError, match=r"no records to write: 2 read, 2 skipped"):
        preprocess([bad_only], str(tmp_path / "out2"), skip_bad=True, progress=False)


def test_outlier_error_and_drop(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", GOOD)
    with pytest.raises(DatasetError, match=r"in\.jsonl:\d+: record has \d+ tokens, above"):
        preprocess([src], str(tmp_path / "a"), max_record_tokens=20, progress=False)
    report = preprocess(
        [src], str(tmp_path / "b"), max_record_tokens=20, outliers="drop", progress=False
    )
    index = open_file_layout(tmp_path / "b").index
    assert report.outliers["dropped"] > 0
    assert len(index) == 12 - report.outliers["dropped"]
    assert int(index.tokens.max()) <= 20


def test_existing_output_is_refused_unless_overwrite(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", GOOD)
    out = str(tmp_path / "out")
    preprocess([src], out, progress=False)
    with pytest.raises(DatasetError, match=r"already exists.*--overwrite"):
        preprocess([src], out, format="wds", progress=False)
    preprocess([src], out, format="wds", overwrite=True, progress=False)
    assert open_file_layout(out).format == "wds"
    assert not list(Path(out).glob("*.mds"))


def test_cli_reports_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [b"{broken"])
    assert main(["preprocess", src, "--output", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcl-stream preprocess: error: ") and "in.jsonl:1" in err
    assert "Traceback" not in err


@pytest.fixture
def dataset(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    src = _jsonl(tmp_path / "in.jsonl", GOOD * 5)
    out = tmp_path / "ds"
    preprocess(
        [src], str(out), format=request.param, progress=False, shard_size_limit=600, maxcount=7
    )
    assert check_integrity(out, read_index(out)) == []
    return out


@pytest.mark.parametrize("dataset", ["mds", "wds"], indirect=True)
def test_missing_shard_is_detected_and_named(dataset: Path) -> None:
    index = read_index(dataset)
    victim = index.shards[1].name
    (dataset / victim).unlink()
    problems = check_integrity(dataset, index)
    assert any(victim in p and "missing" in p for p in problems)
    with pytest.raises(DatasetError, match=victim):
        open_file_layout(dataset, check=True)


@pytest.mark.parametrize("dataset", ["mds", "wds"], indirect=True)
def test_changed_counts_are_detected_and_named(dataset: Path) -> None:
    meta = json.loads((dataset / "bcl_index.json").read_text())
    meta["shards"][0]["samples"] += 1
    meta["shards"][1]["samples"] -= 1
    (dataset / "bcl_index.json").write_text(json.dumps(meta))
    # The sealed index (format 3) refuses the edit on open, naming the field and the fix.
    with pytest.raises(CostIndexError, match=r"field 'shards' was changed.*annotate --overwrite"):
        read_index(dataset)
    with pytest.raises(CostIndexError, match="field 'shards' was changed"):
        read_index(dataset, verify=False)  # not even a reader that skips the hashes takes it


@pytest.mark.parametrize("dataset", ["mds", "wds"], indirect=True)
def test_replaced_cost_array_is_detected(dataset: Path) -> None:
    records = np.load(dataset / "bcl_costs.npy")
    records["tokens"][0] += 1
    np.save(dataset / "bcl_costs.npy", records.astype(COST_DTYPE))
    with pytest.raises(CostIndexError, match="content hash does not match"):
        read_index(dataset)
    problems = check_integrity(dataset, read_index(dataset, verify=False))
    assert any("hash" in p for p in problems)


def test_mds_index_json_with_other_counts_is_detected(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", GOOD * 3)
    out = tmp_path / "ds"
    preprocess([src], str(out), progress=False, shard_size_limit=600)
    meta = json.loads((out / "index.json").read_text())
    meta["shards"][0]["samples"] -= 1
    (out / "index.json").write_text(json.dumps(meta))
    problems = check_integrity(out, read_index(out))
    name, samples = meta["shards"][0]["raw_data"]["basename"], meta["shards"][0]["samples"]
    assert problems == [
        f"shard {name}: index.json says {samples} samples, bcl_index.json says {samples + 1}",
        # the shard itself, checked as the reader checks it, disagrees with index.json too
        f"damaged shard: {name}: header says {samples + 1} samples, index.json says {samples}",
    ]


def test_mds_without_cost_index_asks_for_annotate(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "ds"
    preprocess([src], str(out), progress=False)
    (out / "bcl_index.json").unlink()
    with pytest.raises(CostIndexError, match="annotate"):
        open_file_layout(out)


@pytest.mark.parametrize("dataset", ["wds"], indirect=True)
def test_stray_tar_and_changed_member_count_are_named(dataset: Path) -> None:
    import shutil
    import tarfile

    index = read_index(dataset)
    shutil.copy(dataset / index.shards[0].name, dataset / "shard-999999.tar")
    victim = dataset / index.shards[1].name
    with tarfile.open(victim) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(victim, "w") as tar:
        for member, data in members[:-2]:  # drop the last record (its .npy and .json)
            tar.addfile(member, io.BytesIO(data))
    problems = check_integrity(dataset, index)
    assert "shards not in bcl_index.json: shard-999999.tar" in problems
    want = f"shard {victim.name}: holds {index.shards[1].samples - 1} records, bcl_index.json says"
    assert any(p.startswith(want) for p in problems)


# -- hostile records: nesting, token ids, a cost model that overflows ------------------------

DEEP = b'{"text": "deep", "meta": ' + b"[" * 1000 + b"]" * 1000 + b"}"
HOSTILE_IDS = [
    (b'{"prompt": [1, 2], "response": [5000000000]}', r"token id 5000000000 at position 0"),
    (b'{"prompt": [1, 2], "response": [true, 3]}', r"holds a boolean \(True\) at position 0"),
    (b'{"prompt": [false], "response": [3]}', r"'prompt' holds a boolean \(False\)"),
    (b'{"prompt": [1, 2], "response": [-3]}', r"token id -3 at position 0"),
    (
        b'{"prompt": [1, 2], "response": [4000000000]}',
        r"outside the vocabulary of tokenizer cl100k",
    ),
    (b'{"prompt": [100277], "response": [3]}', r"'prompt' holds token id 100277 .* vocabulary"),
]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_deeply_nested_json_is_a_located_skippable_record(tmp_path: Path, fmt: str) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [*GOOD[:2], DEEP, *GOOD[2:4]])
    with pytest.raises(DatasetError, match=rf"{src}:3: JSON nested too deeply.*--skip-bad"):
        preprocess([src], str(tmp_path / "a"), format=fmt, progress=False)
    report = preprocess([src], str(tmp_path / "b"), format=fmt, skip_bad=True, progress=False)
    assert report.skipped_bad == {"malformed_json": 1}
    assert report.records_written == 4
    assert f"{src}:3 (malformed_json)" in report.skipped_first


@pytest.mark.parametrize(("line", "match"), HOSTILE_IDS)
def test_hostile_token_ids_are_located_bad_records(tmp_path: Path, line: bytes, match: str) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [*GOOD[:2], line])
    with pytest.raises(DatasetError, match=rf"{src}:3: .*{match}"):
        preprocess([src], str(tmp_path / "a"), progress=False)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_hostile_token_ids_are_skipped_and_counted(tmp_path: Path, fmt: str) -> None:
    ok = b'{"prompt": [1, 2], "response": [100276]}'  # the last id cl100k knows
    src = _jsonl(tmp_path / "in.jsonl", [GOOD[0], *(line for line, _ in HOSTILE_IDS), ok])
    report = preprocess([src], str(tmp_path / "o"), format=fmt, skip_bad=True, progress=False)
    assert report.skipped_bad == {"bad_token_id": len(HOSTILE_IDS)}
    assert report.records_written == 2
    listed = (tmp_path / "o" / "bcl_skipped.txt").read_text().splitlines()
    assert [row.split("\t")[0] for row in listed] == [
        f"{src}:{n}" for n in range(2, 2 + len(HOSTILE_IDS))
    ]
    index = read_index(tmp_path / "o")
    assert list(index.tokens) == [int(report.tokens_written) - 4, 4]  # 1 + 2 + 1 (EOS)


def _overflowing_model(tmp_path: Path) -> str:
    path = tmp_path / "huge.json"
    # a record of L tokens costs L + 1e36 L^2: up to 18 tokens fit float32 (3.4e38), 19 do not
    path.write_text(json.dumps({"name": "huge", "a": 1.0, "b": 1e36}))
    return str(path)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_cost_model_that_overflows_is_a_located_skippable_record(tmp_path: Path, fmt: str) -> None:
    model = _overflowing_model(tmp_path)
    short = json.dumps({"text": "one two"}).encode()
    src = _jsonl(tmp_path / "in.jsonl", [short, GOOD[11], short])  # GOOD[11]: 49 tokens
    with pytest.raises(DatasetError, match=rf"{src}:2: cost model 'huge' gives a record of 49"):
        preprocess([src], str(tmp_path / "a"), format=fmt, cost_model=model, progress=False)
    report = preprocess(
        [src], str(tmp_path / "b"), format=fmt, cost_model=model, skip_bad=True, progress=False
    )
    assert report.skipped_bad == {"cost_overflow": 1}
    costs = read_index(tmp_path / "b").costs()
    assert len(costs) == 2 and np.isfinite(costs).all()


def test_cost_model_file_whose_every_cost_overflows_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "inf.json"
    path.write_text(json.dumps({"name": "inf", "a": 1e39}))
    src = _jsonl(tmp_path / "in.jsonl", GOOD[:2])
    argv = ["preprocess", src, "--output", str(tmp_path / "o"), "--no-progress"]
    assert main([*argv, "--cost-model", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"cost model {path}: cost model 'inf' gives a record of 1 tokens" in err


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_annotate_and_the_readers_refuse_a_model_that_overflows(tmp_path: Path, fmt: str) -> None:
    from bcl_stream.cost import CostModel
    from bcl_stream.preprocess.annotate import annotate

    src = _jsonl(tmp_path / "in.jsonl", [json.dumps({"text": "a b"}).encode(), GOOD[11]])
    out = tmp_path / "ds"
    preprocess([src], str(out), format=fmt, cost_model="tokens", progress=False)
    model = _overflowing_model(tmp_path)
    with pytest.raises(
        DatasetError, match=r"shard \S+, record 1 \(record 1 of the dataset\): cost model 'huge'"
    ):
        annotate(out, cost_model=model, overwrite=True, progress=False)
    with pytest.raises(CostIndexError, match=r"record 1: cost model 'huge' gives a record of 49"):
        read_index(out).costs(CostModel.load(model))
