"""Corrupt and mismatched data: each fault gives our own error naming the file, what is wrong
and what to do — never a silent wrong record, never a traceback from inside streaming.

Every test damages a private copy of a small costed MDS dataset and reads it through the real
reader (``MDSPackDataset`` on a stock ``StreamingDataset``) with a ``PackLoader``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_mds
from pack_oracles import check_every_record_once

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import BCLStreamError, CostIndexError, DatasetError, StateError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.io.index import COSTS_NPY, INDEX_JSON
from bcl_stream.io.integrity import ShardVerifier, mds_shard_problem, verify_mds
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "reliability_scripts"
CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, shuffle=False)
SHARD = "shard.00002.mds"


@pytest.fixture(scope="module")
def hashed_mds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conftest dataset's twin written with an xxh64 hash per shard."""
    from conftest import records

    from bcl_stream.formats.mds_writer import CostedMDSWriter

    root = tmp_path_factory.mktemp("hashed") / "ds"
    with CostedMDSWriter(str(root), cost_model="tokens", size_limit=4096, hashes=["xxh64"]) as w:
        for record in records(300):
            w.write(record)
    return root


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(src, dst)
    return dst


def read_all(root: Path | str, config: ReaderConfig = CONFIG) -> list[list[int]]:
    """Every pack of one epoch; checks each record's payload (record i holds the value i)."""
    out = []
    for pack in PackLoader(MDSPackDataset(root, config, 0)):
        for sample in pack:
            ids = sample["input_ids"]
            assert np.all(ids == sample["sample_id"]), f"record {sample['sample_id']} is wrong"
        out.append([int(s["sample_id"]) for s in pack])
    return out


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_intact_dataset_reads_and_verifies(mds_dir: Path, hashed_mds: Path) -> None:
    """The baseline the faults below break: nothing reported, every record once."""
    assert verify_mds(mds_dir) == [] and verify_mds(hashed_mds) == []
    check_every_record_once(read_all(hashed_mds), 300)


# -- damaged shards ---------------------------------------------------------------------
def test_flipped_payload_byte_is_caught_by_the_shard_hash(hashed_mds: Path, tmp_path: Path) -> None:
    root = copy_of(hashed_mds, tmp_path)
    flip(root / SHARD, -1)  # last byte: a token of the shard's last record
    assert "xxh64 content hash differs" in (verify_mds(root)[0])
    with pytest.raises(DatasetError, match=rf"{SHARD}: xxh64 content hash differs.*preprocess"):
        read_all(root)


@pytest.mark.parametrize("position", [0, 5, 40], ids=["count", "offset0", "offset9"])
def test_flipped_header_byte_is_named(mds_dir: Path, tmp_path: Path, position: int) -> None:
    """Without hashes the header check still sees structural damage (was IndexError/ValueError
    from streaming's reader, or for the count byte, nothing at all)."""
    root = copy_of(mds_dir, tmp_path)
    flip(root / SHARD, position)
    with pytest.raises(DatasetError, match=rf"damaged shard: {SHARD}: .*(header|offset)"):
        read_all(root)


@pytest.mark.parametrize("keep", [0, 3, 100, 2000])
def test_truncated_shard_is_named(mds_dir: Path, tmp_path: Path, keep: int) -> None:
    root = copy_of(mds_dir, tmp_path)
    path = root / SHARD
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:keep])
    assert mds_shard_problem(root, json.loads((root / "index.json").read_text())["shards"][2])
    with pytest.raises(DatasetError, match=rf"{SHARD}: truncated: {keep} bytes .* says {size}"):
        read_all(root)


def test_missing_shard_file_is_named(mds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(mds_dir, tmp_path)
    (root / SHARD).unlink()
    with pytest.raises(DatasetError, match=rf"{SHARD}"):
        read_all(root)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("flip@0", r"shard-000002\.tar: unreadable tar shard \(.*checksum.*\) at record \d+"),
        ("cut@100", r"shard-000002\.tar: holds 0 records but the cost index says 37.*annotate"),
        ("cut@5000", r"shard-000002\.tar: holds 1 records but the cost index says 37.*annotate"),
    ],
)
def test_damaged_wds_shard_is_named(wds_dir: Path, tmp_path: Path, damage: str, match: str) -> None:
    from bcl_stream.formats.wds_reader import WDSPackDataset

    root = copy_of(wds_dir, tmp_path)
    path = root / "shard-000002.tar"
    kind, where = damage.split("@")
    if kind == "flip":
        flip(path, int(where))
    else:
        path.write_bytes(path.read_bytes()[: int(where)])
    with pytest.raises(DatasetError, match=match):
        for _ in PackLoader(WDSPackDataset(root, CONFIG, 0)):
            pass


# -- cost index faults ------------------------------------------------------------------
def test_cost_index_hash_mismatch(mds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(mds_dir, tmp_path)
    arr = np.load(root / COSTS_NPY)
    arr["cost"][7] += 1.0
    np.save(root / COSTS_NPY, arr)
    with pytest.raises(
        CostIndexError, match=r"bcl_costs\.npy: content hash does not match.*annotate"
    ):
        MDSPackDataset(root, CONFIG, 0)


def test_cost_index_record_count_mismatch(mds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(mds_dir, tmp_path)
    np.save(root / COSTS_NPY, np.load(root / COSTS_NPY)[:-3])
    with pytest.raises(CostIndexError, match=r"holds 297 records but bcl_index\.json says 300"):
        MDSPackDataset(root, CONFIG, 0)


def test_missing_cost_index_suggests_annotate(mds_dir: Path, tmp_path: Path) -> None:
    root = copy_of(mds_dir, tmp_path)
    (root / INDEX_JSON).unlink()
    (root / COSTS_NPY).unlink()
    with pytest.raises(CostIndexError, match=r"no cost index.*bcl-stream annotate"):
        MDSPackDataset(root, CONFIG, 0)


def test_index_from_a_dataset_with_other_shards(mds_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_mds(other, 250, seed=3)
    root = copy_of(mds_dir, tmp_path)
    for name in (COSTS_NPY, INDEX_JSON):
        shutil.copy(other / name, root / name)
    with pytest.raises(DatasetError, match=r"disagree at shard .*annotate"):
        MDSPackDataset(root, CONFIG, 0)


def test_index_from_a_dataset_with_the_same_layout(mds_dir: Path, tmp_path: Path) -> None:
    """Same shard counts, other record lengths: only the per-record token check can tell."""
    root = copy_of(mds_dir, tmp_path)
    meta = json.loads((root / INDEX_JSON).read_text())
    arr = np.load(root / COSTS_NPY)
    arr["tokens"] = arr["tokens"][::-1]  # another dataset's lengths, same layout
    arr["trained"] = arr["trained"][::-1]  # (and its trained counts: a consistent index)
    arr["cost"] = arr["tokens"].astype(np.float32)
    np.save(root / COSTS_NPY, arr)
    from bcl_stream.io.index import read_index
    from bcl_stream.io.index_meta import seal

    meta["sha256"] = __import__("hashlib").sha256(arr.tobytes()).hexdigest()
    (root / INDEX_JSON).write_text(json.dumps(seal(meta)))  # resealed: a consistent index
    read_index(root)  # the index itself is valid
    with pytest.raises(DatasetError, match=r"record \d+ has \d+ tokens but the cost index says"):
        read_all(root)


def test_verifier_checks_records_against_the_index(mds_dir: Path) -> None:
    from bcl_stream.io.index import read_index

    verifier = ShardVerifier(mds_dir, read_index(mds_dir))
    n = int(verifier.index.tokens[5])
    verifier.check_record(5, {"input_ids": np.zeros(n)})
    with pytest.raises(DatasetError, match=rf"record 5 has {n + 1} tokens"):
        verifier.check_record(5, {"input_ids": np.zeros(n + 1)})


# -- checkpoint state from elsewhere ----------------------------------------------------
def test_state_from_another_dataset_or_configuration(mds_dir: Path, tmp_path: Path) -> None:
    loader = PackLoader(MDSPackDataset(mds_dir, CONFIG, 0))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = tmp_path / "other"
    write_mds(other, 300, seed=9)
    with pytest.raises(StateError, match="saved on other data"):
        PackLoader(MDSPackDataset(other, CONFIG, 0)).load_state_dict(state)
    wider = ReaderConfig.build(world_size=1, pack_size=4, window=3, shuffle=False)
    with pytest.raises(StateError, match=r"window=2 but the loader has window=3"):
        PackLoader(MDSPackDataset(mds_dir, wider, 0)).load_state_dict(state)


# -- interrupted preprocessing ----------------------------------------------------------
def test_writer_interrupted_by_an_exception_leaves_a_refused_dataset(tmp_path: Path) -> None:
    from conftest import records

    from bcl_stream.formats.mds_writer import CostedMDSWriter

    root = tmp_path / "ds"
    writer = CostedMDSWriter(str(root), cost_model="tokens", size_limit=4096)
    with pytest.raises(KeyboardInterrupt), writer:
        for i, record in enumerate(records(300)):
            if i == 200:
                raise KeyboardInterrupt
            writer.write(record)
    assert not (root / "index.json").exists()
    with pytest.raises(BCLStreamError, match=r"incomplete dataset.*--overwrite"):
        MDSPackDataset(root, CONFIG, 0)


def test_preprocess_killed_mid_write(tmp_path: Path) -> None:
    """SIGKILL a writer process mid-dataset: the leftover is refused as incomplete, and a
    re-run over it needs --overwrite (prepare_output) and then reads every record."""
    from bcl_stream.preprocess.output import prepare_output

    root = tmp_path / "ds"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "slow_writer.py"), str(root), "400"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(root.glob("*.mds"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(list(root.glob("*.mds"))) >= 3 and not (root / "index.json").exists()
    with pytest.raises(BCLStreamError, match=r"incomplete dataset.*--overwrite"):
        MDSPackDataset(root, CONFIG, 0)
    with pytest.raises(DatasetError, match=r"already exists.*--overwrite"):
        prepare_output(str(root), overwrite=False)
    prepare_output(str(root), overwrite=True)
    write_mds(root, 300)
    check_every_record_once(read_all(root), 300)
