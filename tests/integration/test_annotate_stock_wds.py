"""Stock WebDataset layouts ``annotate`` used to pass and the readers then refused or read short:

- a filtered corpus written by ``webdataset.TarWriter`` keeps its numbered keys with gaps
  (``000000``, ``000001``, ``000003``, ...); the reader took them for record ids and refused the
  first gap ("shards renamed or reordered?"). ``annotate`` now records that the keys are names,
  and the reader reads every record once;
- a tar holding a symbolic or hard link as a member: every WebDataset reader reads regular
  files only, so ``annotate`` counted the records without it and they were dropped silently.
  It is now refused in one line naming the shard and the member.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.records.source import RecordSource

pytestmark = pytest.mark.shared_process

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, seed=1)
KEPT = [i for i in range(90) if i % 3 != 2]
"""Records that survive the filter: the keys keep their original numbers (gaps at 2, 5, ...)."""


def filtered_corpus(out: Path) -> Path:
    """Two tars by ``webdataset.TarWriter``, record ``i`` holding ``i`` repeated ``3 + i % 5``
    times under its original key."""
    import webdataset as wds

    out.mkdir(parents=True)
    for shard, part in enumerate((KEPT[:30], KEPT[30:])):
        with wds.TarWriter(str(out / f"shard-{shard:06d}.tar")) as sink:
            for i in part:
                ids = np.full(3 + i % 5, i, dtype=np.int32)
                sink.write({"__key__": f"{i:06d}", "tokens.npy": ids})
    return out


def read_all(root: Path) -> dict[int, int]:
    """Every record the plan gives rank 0: record id -> the one value its ids repeat."""
    dataset = WDSPackDataset(str(root), CONFIG, 0)
    seen: dict[int, int] = {}
    for pack in PackLoader(dataset):
        for record in pack:
            values = set(np.asarray(record["input_ids"]).tolist())
            assert len(values) == 1  # one record's own ids, never a mix
            assert int(record["sample_id"]) not in seen  # each record once
            seen[int(record["sample_id"])] = values.pop()
    assert sorted(seen) == sorted(dataset.epoch_plan(0).rank_packs(0).ravel().tolist())
    return seen


def test_numbered_keys_with_gaps_are_read(tmp_path: Path) -> None:
    root = filtered_corpus(tmp_path / "ds")
    index = annotate(
        root, source=RecordSource(tokens_field="tokens"), cost_model="tokens", progress=False
    )
    assert index.extra["record_keys"] == "names" and len(index) == len(KEPT)
    seen = read_all(root)
    # record n of the dataset (shard order) is the n-th kept record: its ids say which
    assert all(KEPT[sid] == value for sid, value in seen.items())


def test_keys_that_are_the_record_ids_keep_the_key_check(tmp_path: Path) -> None:
    """Keys equal to the global record ids (what preprocess writes): nothing recorded, and a
    shard swapped after annotate is still refused naming the key."""
    import webdataset as wds

    root = tmp_path / "ds"
    root.mkdir()
    for shard in range(2):
        with wds.TarWriter(str(root / f"shard-{shard:06d}.tar")) as sink:
            for i in range(shard * 20, shard * 20 + 20):
                sink.write({"__key__": f"{i:010d}", "tokens.npy": np.full(4, i, np.int32)})
    index = annotate(
        root, source=RecordSource(tokens_field="tokens"), cost_model="tokens", progress=False
    )
    assert "record_keys" not in index.extra
    assert all(sid == value for sid, value in read_all(root).items())
    a, b = root / "shard-000000.tar", root / "shard-000001.tar"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(DatasetError, match=r"record key '0000000020' is not the expected"):
        read_all(root)


def _tar_with_link(path: Path, kind: bytes) -> None:
    """Records 0..3 as regular files, record 4's tokens a link to record 3's."""
    with tarfile.open(path, "w") as tar:
        for i in range(4):
            data = np.lib.format
            buf = io.BytesIO()
            data.write_array(buf, np.full(3, i, dtype=np.int32))
            info = tarfile.TarInfo(f"{i:06d}.tokens.npy")
            info.size = len(buf.getvalue())
            tar.addfile(info, io.BytesIO(buf.getvalue()))
        link = tarfile.TarInfo("000004.tokens.npy")
        link.type = kind
        link.linkname = "000003.tokens.npy"
        tar.addfile(link)


@pytest.mark.parametrize(
    ("kind", "word"), [(tarfile.SYMTYPE, "symbolic"), (tarfile.LNKTYPE, "hard")]
)
def test_a_link_member_is_refused_naming_shard_and_member(
    tmp_path: Path, kind: bytes, word: str
) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    _tar_with_link(root / "shard-000000.tar", kind)
    with pytest.raises(
        DatasetError,
        match=rf"^shard-000000\.tar: member '000004\.tokens\.npy' is a {word} link \(to "
        r"'000003\.tokens\.npy'\): .*Rewrite the shard with the files themselves",
    ):
        annotate(
            root, source=RecordSource(tokens_field="tokens"), cost_model="tokens", progress=False
        )
    assert not (root / "bcl_index.json").exists()


@pytest.mark.parametrize("bad", [5_000_000_000, -1])
def test_token_ids_no_vocabulary_holds_are_refused(tmp_path: Path, bad: int) -> None:
    """Ids outside [0, 2**32) in a stock token column (int64 .npy members; llm-foundry's raw
    int64 bytes): before, annotate counted them and training met them as an out-of-range
    embedding lookup; now one line names the record, the id and its position."""
    import webdataset as wds
    from streaming import MDSWriter

    ids = np.array([7, 8, bad, 9], dtype=np.int64)
    wroot = tmp_path / "wds"
    wroot.mkdir()
    with wds.TarWriter(str(wroot / "shard-000000.tar")) as sink:
        for i in range(3):
            sink.write({"__key__": f"{i:06d}", "tokens.npy": ids if i == 1 else ids[:2]})
    with pytest.raises(DatasetError, match=rf"sample 000001: .*token id {bad} at position 2"):
        annotate(
            wroot, source=RecordSource(tokens_field="tokens"), cost_model="tokens", progress=False
        )
    mroot = tmp_path / "mds"
    with MDSWriter(out=str(mroot), columns={"tokens": "bytes"}) as writer:
        for i in range(3):
            writer.write({"tokens": (ids if i == 2 else ids[:2]).tobytes()})
    with pytest.raises(DatasetError, match=rf"sample 2: .*token id {bad} at position 2"):
        annotate(
            mroot,
            source=RecordSource(tokens_field="tokens", tokens_dtype="int64"),
            cost_model="tokens",
            progress=False,
        )
