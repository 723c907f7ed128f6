"""Reading at training speed: the WebDataset reader's member index and node-shared cache, one
reader set-up for both formats, shard limits that serve the plan, and the warnings that say
when a dataset or a cache does not fit the world it is planned for.

Invariants, not timings: every record once per epoch with 0/2/4 workers at scope node (both
formats), a resume under another worker count yields the rest of the plan, each remote shard
is fetched once per node whichever rank or thread needs it first, the refused ``prefetch=``
keyword names its replacement, writers agree on shard sizes.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import records, write_mds, write_wds
from pack_oracles import check_every_record_once
from resume_harness import run_test_save_load_state

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.mds_writer import CostedMDSWriter
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import DatasetReader
from bcl_stream.formats.shard_limits import SHARD_RECORDS
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.formats.wds_shards import ShardRecords, index_shard
from bcl_stream.formats.wds_writer import CostedWDSWriter
from bcl_stream.io.index import read_index as load_index
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow

NODE = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=3, window=4, scope="node")


def _open(fmt: str, root: Path | str, config: ReaderConfig, rank: int, **kw: Any) -> DatasetReader:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    return reader(root, config, rank, **kw)


def _checked_key(pack: list[dict[str, Any]]) -> tuple[int, ...]:
    """The pack's record ids; every record must hold its own id (the right bytes were read)."""
    assert all(np.all(r["input_ids"] == r["sample_id"]) for r in pack)
    return tuple(int(r["sample_id"]) for r in pack)


def _ids(loader: PackLoader) -> list[list[int]]:
    return [list(_checked_key(pack)) for pack in loader]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
@pytest.mark.parametrize(("before", "after"), [(2, 4), (4, 0), (0, 2)])
def test_resume_under_another_worker_count_yields_the_rest_of_the_plan(
    fmt: str, before: int, after: int, mds_dir: Path, wds_dir: Path
) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    dataset = _open(fmt, root, NODE, 1)
    plan = dataset.epoch_plan(0).rank_packs(1).tolist()
    run_test_save_load_state(
        lambda: PackLoader(dataset, num_workers=before),
        epochs=1,
        positions=[5],
        key=_checked_key,
        make_resumed=lambda: PackLoader(_open(fmt, root, NODE, 1), num_workers=after),
        reference=[[tuple(p) for p in plan]],
    )


def test_wds_node_scope_every_record_once_with_4_workers(wds_dir: Path) -> None:
    seen: list[int] = []
    for rank in range(NODE.plan.world_size):
        loader = PackLoader(_open("wds", wds_dir, NODE, rank), num_workers=4)
        seen += [i for p in _ids(loader) for i in p]
        left = loader.plan_dataset.remainder_counts()
    check_every_record_once(seen)
    assert len(seen) == 300 - sum(left.values())


def test_member_index_reads_every_record_like_a_scan(wds_dir: Path) -> None:
    index = load_index(wds_dir)
    first = 0
    for entry in index.shards:
        members = index_shard(entry.name, wds_dir / entry.name, first, entry.samples, _no_check)
        assert len(members) == entry.samples
        for i in range(len(members)):
            raw = members.raw(i)
            ids = np.load(__import__("io").BytesIO(raw["input_ids.npy"]))
            assert np.all(ids == first + i) and json.loads(raw["json"])["tokens"] == ids.size
        first += entry.samples
        members.close()


def _no_check(shard: str, key: str, sample_id: int) -> None:
    assert int(key) == sample_id, (shard, key)


def test_member_index_is_shared_through_the_cache_dir(wds_dir: Path, tmp_path: Path) -> None:
    config = ReaderConfig.build(world_size=1, pack_size=4, window=2)
    cache = tmp_path / "cache"
    one = WDSPackDataset(wds_dir, config, 0, cache_dir=cache)
    packs = _ids(PackLoader(one))
    saved = sorted((cache / ".members").glob("*.npz"))
    assert len(saved) == len(one.index.shards)
    again = WDSPackDataset(wds_dir, config, 0, cache_dir=cache)
    loaded = again.shards.records(0)
    scanned = one.shards.records(0) if 0 in one.shards._records else None
    assert isinstance(loaded, ShardRecords) and len(loaded) == one.index.shards[0].samples
    assert scanned is None or np.array_equal(scanned.offset, loaded.offset)
    assert _ids(PackLoader(again)) == packs


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_prefetch_keyword_is_refused_with_its_replacement(
    fmt: str, mds_dir: Path, wds_dir: Path
) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    with pytest.raises(ValueError, match=r"options=ReadOptions\(prefetch=5\)"):
        _open(fmt, root, NODE, 0, prefetch=5)
    with pytest.raises(ValueError, match=r"options already says prefetch=1"):
        _open(fmt, root, NODE, 0, prefetch=5, options=ReadOptions(prefetch=1))
    dataset = _open(fmt, root, NODE, 0, options=ReadOptions(prefetch=4))
    assert dataset.prefetch == dataset.options.prefetch == 4
    assert _open(fmt, root, NODE, 0).prefetch == ReadOptions().prefetch


def test_writers_agree_on_shard_records(tmp_path: Path) -> None:
    n = SHARD_RECORDS + SHARD_RECORDS // 2
    with CostedMDSWriter(str(tmp_path / "mds"), cost_model="tokens") as mds:
        for record in records(n):
            mds.write(record)
    with CostedWDSWriter(str(tmp_path / "wds"), cost_model="tokens") as wds:
        for record in records(n):
            wds.write(record)
    counts = [e.samples for e in load_index(tmp_path / "mds").shards]
    assert counts == [e.samples for e in load_index(tmp_path / "wds").shards]
    assert counts == [SHARD_RECORDS, n - SHARD_RECORDS]


def test_inspect_warns_about_too_few_shards_for_the_world(
    mds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = len(load_index(mds_dir).shards)
    assert main(["inspect", str(mds_dir), "--json"]) == 0
    assert "warnings" not in json.loads(capsys.readouterr().out)
    assert main(["inspect", str(mds_dir), "--world-size", "8", "--ranks-per-node", "8"]) == 0
    assert "warning" not in capsys.readouterr().out  # one node reads every shard anyway
    argv = ["inspect", str(mds_dir), "--world-size", "32", "--ranks-per-node", "8", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["planned_for"] == {
        "world_size": 32,
        "ranks_per_node": 8,
        "nodes": 4,
        "node_layout": "4 nodes x 8 ranks (world 32)",
    }
    (warning,) = report["warnings"]
    assert f"{shards} shards for 4 nodes" in warning and "--shard-records" in warning


def test_remote_wds_node_shares_one_cache_and_fetches_each_shard_once(  # type: ignore[no-untyped-def]
    moto_s3, tmp_path: Path
) -> None:
    remote = moto_s3("bcl-speed-node") + "/train"
    write_wds(remote, 240, maxcount=20)  # 12 tars
    config = ReaderConfig.build(world_size=2, ranks_per_node=2, pack_size=4, window=3)
    cache = tmp_path / "node-cache"
    readers = [WDSPackDataset(remote, config, r, cache_dir=cache) for r in range(2)]
    got: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def read(rank: int) -> None:
        try:
            got[rank] = _ids(PackLoader(readers[rank]))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for rank in range(2):
        assert got[rank] == readers[rank].epoch_plan(0).rank_packs(rank).tolist()
    needed = {int(s) for r in readers for s in r.shards.shard_of(np.concatenate(
        [np.asarray(p, dtype=np.int64).ravel() for p in got[r.rank]]))}  # fmt: skip
    assert sum(r.shards.downloads for r in readers) == len(needed)
    assert len(list(cache.glob("*.tar"))) == len(needed)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_cache_limit_below_the_working_set_is_reported_with_the_size(  # type: ignore[no-untyped-def]
    fmt: str, moto_s3, tmp_path: Path
) -> None:
    remote = moto_s3(f"bcl-speed-fit-{fmt}") + "/train"
    if fmt == "mds":
        write_mds(remote, 240, size_limit=2048)
    else:
        write_wds(remote, 240, maxcount=20)
    config = ReaderConfig.build(world_size=1, pack_size=4, window=3, shard_group=16)
    with pytest.warns(UserWarning, match=r"below a node's shard working set of about (\d+) bytes"):
        small = _open(fmt, remote, config, 0, cache_dir=tmp_path / "a",
                      options=ReadOptions(cache_limit=1 << 14 if fmt == "mds" else 2048))  # fmt: skip
    needed = small._check_cache_fit(_sizes(small))
    assert needed is not None and needed > (small.options.cache_bytes or 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        roomy = _open(fmt, remote, config, 0, cache_dir=tmp_path / "b",
                      options=ReadOptions(cache_limit=needed))  # fmt: skip
        assert roomy._check_cache_fit(_sizes(roomy)) == needed


def _sizes(reader: DatasetReader) -> list[int]:
    if isinstance(reader, MDSPackDataset):
        return [int(s.get_max_size()) for s in reader.streaming.shards]
    from bcl_stream.io.remote import remote_sizes

    return remote_sizes(reader.location, [e.name for e in reader.index.shards])


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_cli_read_json_reports_first_pack_rate_and_memory(
    fmt: str, mds_dir: Path, wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    argv = ["read", str(root), "--world-size", "2", "--ranks-per-node", "2", "--rank", "1"]
    assert main([*argv, "--pack-size", "3", "--window", "2", "--num-workers", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3 * len(out["packs"]) > 0
    assert 0 < out["first_pack_seconds"] <= out["seconds"]
    assert out["records_per_second"] == pytest.approx(out["records"] / out["seconds"], rel=0.01)
    assert out["records_per_second_after_first_pack"] > 0
    assert out["peak_rss_mb"] > 50 and out["worker_peak_rss_mb"] > 50  # torch alone is more


def test_compressed_tars_are_read_through_and_follow_the_plan(tmp_path: Path) -> None:
    root = tmp_path / "gz"
    with CostedWDSWriter(str(root), cost_model="tokens", maxcount=20, compress=True) as writer:
        for record in records(100):
            writer.write(record)
    assert len(list(root.glob("*.tar.gz"))) == 5
    config = ReaderConfig.build(world_size=2, ranks_per_node=2, pack_size=3, window=2)
    seen = []
    for rank in range(2):
        dataset = WDSPackDataset(root, config, rank)
        packs = _ids(PackLoader(dataset, num_workers=2))
        assert packs == dataset.epoch_plan(0).rank_packs(rank).tolist()
        seen += [i for p in packs for i in p]
    check_every_record_once(seen)
    assert len(seen) == 100 - sum(dataset.remainder_counts().values())
