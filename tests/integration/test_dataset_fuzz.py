"""Fuzzing what comes with a dataset (issue 42, "Bounded parsers"): headers, indexes and cost
files of small real datasets of both formats, mutated as damage or an attacker would, and read
back through the real readers (MDS through a stock ``StreamingDataset``, WebDataset through our
tar reader).

On every mutation the read either raises one of our errors (:mod:`bcl_stream.errors`) or reads
exactly the records of the intact dataset (same ids, same tokens), and returns within
``BOUND_S`` (a watchdog fails the test on a hang instead of hanging the suite). Nothing else:
no exception from inside numpy, json, tarfile or streaming, no silently different record, no
file written outside the dataset. WebDataset tar mutations also go through ``inspect``'s checks
(:func:`check_integrity`), which must return a report or raise one of our errors.

What is mutated:

- ``index.json`` (MDS) and ``bcl_index.json``: a field of a shard entry or of the document set
  to a hostile value (huge, negative, fractional, boolean, wrong type, ``../`` and absolute
  names, long strings), a byte flipped, or the file cut short; ``bcl_index.json`` is resealed
  after half of its edits (the seal is a self-hash anyone can recompute), so those reach the
  checks behind it;
- ``bcl_costs.npy`` / ``bcl_hashes.npy``: a byte flipped in the header or the data, the file
  cut short, the header's shape made huge; half of them with ``bcl_index.json``'s hashes
  recomputed to match;
- MDS shard headers (sample count, offset table);
- tar headers (every field of a ustar header, pax records' lengths and values, GNU base-256
  sizes), the header checksum recomputed after most edits so the damage reaches the parser.

Examples are drawn by hypothesis under the suite's profile (``ci``: the same draws every run);
each example is one seed that picks the target, the operation and the value. The tally of
outcomes is printed at the end of each test (``pytest -s``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_mds, write_wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from watchdog import within

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import BCLStreamError
from bcl_stream.formats.dataset_files import check_integrity
from bcl_stream.formats.open_reader import open_reader
from bcl_stream.formats.tar_scan import BLOCK
from bcl_stream.io.index import read_index
from bcl_stream.io.index_meta import FIELDS_KEY, seal

pytestmark = pytest.mark.slow

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, shuffle=False)
BOUND_S = 20.0
"""A read of these datasets takes about 0.1 s; a read still running after this has hung."""
RECORDS = 40
MDS_EXAMPLES = 80
WDS_EXAMPLES = 160

HOSTILE: tuple[Any, ...] = (
    0,
    -1,
    1,
    7,
    10**12,
    2**64,
    -(2**63),
    1.5,
    float("1e308"),
    True,
    None,
    "",
    "12",
    "../../x/planted",
    "/tmp/planted",
    "a/../../planted",
    "./shard",
    "C:\\planted",
    "x" * 5000,
    "shard\0.mds",
    [],
    {},
    [1, 2],
    {"basename": "../planted"},
)
"""Values a field of an index is set to."""

TAR_VALUES: tuple[bytes, ...] = (
    b"",
    b"\0" * 12,
    b"0",
    b"-1",
    b"77777777777",
    b"\x80" + (2**86).to_bytes(11, "big"),
    b"\xff" * 12,
    b"12junk\0",
    b"../../planted.json",
    b"/tmp/planted.json",
    b"9" * 12,
    b"x",
    b"L",
    b"K",
    b"g",
    b"5",
    b"1",
    b"2",
)
"""Bytes written over a tar header field."""

PAX_EDITS: tuple[bytes, ...] = (
    b"0",
    b"-9",
    b"1",
    b"99999",
    b"x",
    b"",
    b"\0",
    b" ",
)
"""Bytes written over a pax record's length digits."""

TAR_FIELDS = {
    "name": (0, 100),
    "mode": (100, 8),
    "uid": (108, 8),
    "mtime": (136, 12),
    "size": (124, 12),
    "kind": (156, 1),
    "linkname": (157, 100),
    "magic": (257, 8),
    "prefix": (345, 155),
}


# -- the datasets ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    write_mds(base / "mds", RECORDS, size_limit=1024)
    write_wds(base / "wds", RECORDS, maxcount=13)
    return {"mds": base / "mds", "wds": base / "wds"}


def read_records(root: Path) -> list[tuple[int, bytes]]:
    """(record id, token bytes) of one epoch, in yield order."""
    out = []
    for pack in open_reader(str(root), CONFIG, 0, None):
        for record in pack:
            out.append((int(record["sample_id"]), np.asarray(record["input_ids"]).tobytes()))
    return out


@pytest.fixture(scope="module")
def intact(written: dict[str, Path]) -> dict[str, list[tuple[int, bytes]]]:
    return {fmt: read_records(root) for fmt, root in written.items()}


# -- mutations ------------------------------------------------------------------------------
def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (keys and list positions)."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):  # the first few entries of long lists
            yield from json_paths(item, (*prefix, i))


def set_path(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def reseal(root: Path) -> None:
    """Recompute what ``bcl_index.json`` says about the arrays and its own fields, as an
    attacker who edited them would."""
    path = root / "bcl_index.json"
    try:
        doc = json.loads(path.read_text())
        doc["sha256"] = array_sha256(root / "bcl_costs.npy")
        if isinstance(doc.get("record_hashes"), dict) and (root / "bcl_hashes.npy").is_file():
            data = np.load(root / "bcl_hashes.npy", allow_pickle=False)
            doc["record_hashes"]["sha256"] = hashlib.sha256(data.tobytes()).hexdigest()
        doc.pop(FIELDS_KEY, None)
        doc.pop("format_version", None)
        path.write_text(json.dumps(seal(doc)))
    except Exception:  # a document too damaged to reseal stays as it is
        return


def array_sha256(npy: Path) -> str:
    """SHA-256 of an array file's data (what ``sha256`` in ``bcl_index.json`` covers)."""
    return hashlib.sha256(np.load(npy, mmap_mode="r", allow_pickle=False).tobytes()).hexdigest()


def mutate_json(path: Path, rng: random.Random) -> str:
    text = path.read_bytes()
    op = rng.choice(["field", "field", "field", "flip", "cut"])
    if op == "flip":
        at = rng.randrange(len(text))
        path.write_bytes(text[:at] + bytes([text[at] ^ (1 << rng.randrange(8))]) + text[at + 1 :])
        return f"{path.name}: flip byte {at}"
    if op == "cut":
        keep = rng.randrange(len(text))
        path.write_bytes(text[:keep])
        return f"{path.name}: cut to {keep} bytes"
    doc = json.loads(text)
    where = rng.choice(list(json_paths(doc)))
    value = rng.choice(HOSTILE)
    set_path(doc, where, value)
    path.write_text(json.dumps(doc))
    return f"{path.name}: {'.'.join(map(str, where))} = {str(value)[:40]!r}"


def mutate_npy(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    header = data.index(b"\n") + 1
    op = rng.choice(["flip header", "flip data", "cut", "huge shape"])
    if op == "cut":
        keep = rng.randrange(len(data))
        path.write_bytes(bytes(data[:keep]))
        return f"{path.name}: cut to {keep} bytes"
    if op == "huge shape":
        text = data[:header].decode("latin-1")
        start = text.index("'shape': (") + len("'shape': (")
        end = text.index(",", start)
        huge = str(rng.choice([10**12, 2**62, 0, 1]))
        new = text[:start] + huge + text[end:]
        pad = len(text) - len(new)
        new = new[:-1] + " " * pad + "\n" if pad >= 0 else new
        path.write_bytes(new.encode("latin-1") + bytes(data[header:]))
        return f"{path.name}: shape ({huge},)"
    lo, hi = (0, header) if op == "flip header" else (header, len(data))
    at = rng.randrange(lo, hi)
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{path.name}: {op} at {at}"


def mutate_mds_shard(root: Path, rng: random.Random) -> str:
    shard = rng.choice(sorted(root.glob("*.mds")))
    data = bytearray(shard.read_bytes())
    count = int(np.frombuffer(bytes(data[:4]), "<u4")[0])
    at = rng.randrange(min(len(data), 4 + 4 * (count + 1)))
    data[at] = rng.randrange(256)
    shard.write_bytes(bytes(data))
    return f"{shard.name}: header byte {at}"


def header_offsets(data: bytes) -> list[int]:
    """Offsets of the header blocks of an intact tar."""
    out, at = [], 0
    while at + BLOCK <= len(data) and data[at : at + BLOCK] != bytes(BLOCK):
        out.append(at)
        size = int(data[at + 124 : at + 136].split(b"\0")[0].strip() or b"0", 8)
        at += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    return out


def fix_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + BLOCK])


def mutate_tar(root: Path, rng: random.Random) -> str:
    shard = rng.choice(sorted(root.glob("*.tar")))
    data = bytearray(shard.read_bytes())
    at = rng.choice(header_offsets(bytes(data)))
    kind = data[at + 156 : at + 157]
    if kind == b"x" and rng.random() < 0.5:  # a pax record's length or value
        body = at + BLOCK
        if rng.random() < 0.5:
            new = rng.choice(PAX_EDITS)
            data[body : body + 2] = (new + b"  ")[:2]
            what = f"pax length {new!r}"
        else:
            record = rng.choice(
                [
                    b"11 size=-1\n",
                    b"13 path=../x\n",
                    b"10 size=x\n",
                    b"30 size=999999999999999999\n",
                ]
            )
            data[body : body + len(record)] = record
            what = f"pax record {record!r}"
        shard.write_bytes(bytes(data))
        return f"{shard.name}: header at {at}: {what}"
    field = rng.choice(sorted(TAR_FIELDS))
    start, width = TAR_FIELDS[field]
    value = rng.choice(TAR_VALUES)
    data[at + start : at + start + width] = value[:width].ljust(width, b"\0")
    fixed = rng.random() < 0.8
    if fixed:
        fix_checksum(data, at)
    shard.write_bytes(bytes(data))
    return f"{shard.name}: header at {at}: {field} = {value[:24]!r}{' (checksum fixed)' * fixed}"


def mutate(fmt: str, root: Path, rng: random.Random) -> str:
    targets: dict[str, Callable[[], str]] = {
        "bcl_index.json": lambda: mutate_json(root / "bcl_index.json", rng),
        "bcl_costs.npy": lambda: mutate_npy(root / "bcl_costs.npy", rng),
    }
    if fmt == "mds":
        targets["index.json"] = lambda: mutate_json(root / "index.json", rng)
        targets["shard"] = lambda: mutate_mds_shard(root, rng)
        weights = {"index.json": 3, "bcl_index.json": 3, "bcl_costs.npy": 2, "shard": 1}
    else:
        targets["bcl_hashes.npy"] = lambda: mutate_npy(root / "bcl_hashes.npy", rng)
        targets["tar"] = lambda: mutate_tar(root, rng)
        weights = {"tar": 6, "bcl_index.json": 2, "bcl_costs.npy": 1, "bcl_hashes.npy": 1}
    names = sorted(weights)
    target = rng.choices(names, [weights[n] for n in names])[0]
    what = targets[target]()
    if target != "tar" and target != "shard" and rng.random() < 0.5:
        reseal(root)
        what += " (resealed)"
    return what


# -- the property ---------------------------------------------------------------------------
TALLY: dict[str, Counter[str]] = {"mds": Counter(), "wds": Counter()}


@pytest.fixture(scope="module", autouse=True)
def print_tally() -> Iterator[None]:
    """The outcomes of this file's mutations, printed at its end (``pytest -s``)."""
    yield
    for fmt, tally in TALLY.items():
        print(f"\nfuzz {fmt}: {sum(tally.values())} mutations: {dict(sorted(tally.items()))}")


def outcome(fmt: str, root: Path, intact: list[tuple[int, bytes]], what: str) -> str:
    """``refused`` or ``identical``; anything else fails the test naming the mutation."""
    try:
        got = within(BOUND_S, lambda: read_records(root), what)
    except BCLStreamError:
        return "refused"
    except Exception as exc:
        pytest.fail(f"{what}: crashed with {type(exc).__name__}: {exc}")
    assert got == intact, f"{what}: read different records without an error"
    return "identical"


def fuzz_one(fmt: str, src: Path, intact: list[tuple[int, bytes]], seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="bcl-fuzz-") as tmp:
        root = Path(tmp) / "a" / "ds"
        shutil.copytree(src, root)
        what = f"seed {seed}: " + mutate(fmt, root, rng)
        result = outcome(fmt, root, intact, what)
        if "tar" in what.split(":", 2)[1]:  # what inspect does with a damaged shard
            try:
                index = read_index(root)
                report = within(BOUND_S, lambda: check_integrity(root, index), what)
                assert isinstance(report, list)
            except BCLStreamError:
                pass
        planted = [*Path(tmp).rglob("planted*"), *Path("/tmp").glob("planted*")]
        assert planted == [], f"{what}: wrote {planted}"
    TALLY[fmt][result] += 1


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(FUZZ, max_examples=MDS_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_mds_dataset(written: dict[str, Path], intact: dict[str, Any], seed: int) -> None:
    fuzz_one("mds", written["mds"], intact["mds"], seed)


@settings(FUZZ, max_examples=WDS_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_wds_dataset(written: dict[str, Path], intact: dict[str, Any], seed: int) -> None:
    fuzz_one("wds", written["wds"], intact["wds"], seed)


# -- named cases from the issue (each failed before the fix: a traceback or a hang) ---------
def copy_of(src: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(src, root)
    return root


def test_huge_sample_count_in_index_json(written: dict[str, Path], tmp_path: Path) -> None:
    """``"samples": 10**12`` used to size streaming's arrays (a 7.28 TiB allocation)."""
    root = copy_of(written["mds"], tmp_path)
    doc = json.loads((root / "index.json").read_text())
    doc["shards"][0]["samples"] = 10**12
    (root / "index.json").write_text(json.dumps(doc))
    with pytest.raises(BCLStreamError, match=r"disagree at shard 0 .*1000000000\d* records"):
        within(BOUND_S, lambda: read_records(root), "samples 10**12")


def test_deleted_wds_shard_is_named(written: dict[str, Path], tmp_path: Path) -> None:
    """A missing tar used to be a bare ``FileNotFoundError``."""
    root = copy_of(written["wds"], tmp_path)
    (root / "shard-000001.tar").unlink()
    with pytest.raises(BCLStreamError, match=r"shard 1 \(shard-000001\.tar\) is missing"):
        within(BOUND_S, lambda: read_records(root), "deleted shard")


def first_header(data: bytes, kind: bytes) -> int:
    return next(at for at in header_offsets(data) if data[at + 156 : at + 157] == kind)


@pytest.mark.parametrize("case", ["pax length 0", "base-256 size 2**86"])
def test_crafted_header_in_a_real_shard(
    written: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """A pax record length of 0 used to hang the reader; a base-256 size of 2**86 was an
    ``OverflowError``. Both are one error naming the shard."""
    root = copy_of(written["wds"], tmp_path)
    shard = root / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    if case == "pax length 0":
        at = first_header(bytes(data), b"x") + BLOCK
        data[at : at + 2] = b"0 "
    else:
        at = first_header(bytes(data), b"0")
        data[at + 124 : at + 136] = b"\x80" + (2**86).to_bytes(11, "big")
        fix_checksum(data, at)
    shard.write_bytes(bytes(data))
    with pytest.raises(BCLStreamError, match=r"shard-000001\.tar: unreadable tar shard") as caught:
        within(BOUND_S, lambda: read_records(root), case)
    assert "at byte" in str(caught.value)


ENTRY_EDITS = {
    "bytes 2**64": (("raw_data", "bytes"), 2**64),
    "hashes not a mapping": (("raw_data", "hashes"), 1.5),
    "unknown hash algorithm": (("raw_data", "hashes"), {"nope": "00"}),
    "entry version 3": (("version",), 3),
}
"""index.json entry edits a sweep of every field found crashing the reader (``OverflowError``,
``AttributeError``, ``ValueError`` and streaming's ``AssertionError``), fewer than the fuzz's
draws reach."""


@pytest.mark.parametrize("case", sorted(ENTRY_EDITS))
def test_index_json_entry_edit_is_refused(
    written: dict[str, Path], tmp_path: Path, case: str
) -> None:
    path, value = ENTRY_EDITS[case]
    root = copy_of(written["mds"], tmp_path)
    doc = json.loads((root / "index.json").read_text())
    set_path(doc, ("shards", 1, *path), value)
    (root / "index.json").write_text(json.dumps(doc))
    with pytest.raises(BCLStreamError, match=r"shard entry 1|shard\.00001\.mds"):
        within(BOUND_S, lambda: read_records(root), case)
