"""``s3://`` datasets served by a local moto server: both readers download, cache and
prefetch shards and yield exactly the plan; resume works from the remote too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from resume_harness import run_test_save_load_state

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow

CONFIG = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=4, scope="world")


def ids(loader: PackLoader) -> list[list[int]]:
    out = []
    for pack in loader:
        assert all(np.all(s["input_ids"] == s["sample_id"]) for s in pack)
        out.append([int(s["sample_id"]) for s in pack])
    return out


def test_mds_from_s3_with_workers_and_resume(moto_s3, dataset_writers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote = moto_s3("bcl-mds") + "/train"
    dataset_writers[0](remote, 200)
    dataset = MDSPackDataset(
        remote, CONFIG, 1, cache_dir=tmp_path / "cache", options=ReadOptions(prefetch=2)
    )
    plan = dataset.epoch_plan(0).rank_packs(1).tolist()
    loader = PackLoader(dataset, num_workers=2)
    assert ids(loader) == plan
    assert len(list((tmp_path / "cache").glob("shard.*.mds"))) > 1  # shards came from S3
    # Resume mid-epoch, from the same process's live dataset (one per cache dir). Read in a
    # worker: a StreamingDataset iterated in this process leaves streaming's download threads
    # running here, and the next test forks its DataLoader workers from this process; a fork
    # taken while such a thread held a lock (boto's) left a worker's downloads hung until
    # their deadline (every attempt), in full runs of the suite.
    reference = [[tuple(p) for p in plan]]
    run_test_save_load_state(
        lambda: PackLoader(dataset, num_workers=1), 1, [5], reference=reference
    )


def test_wds_from_s3_via_cli(  # type: ignore[no-untyped-def]
    moto_s3, dataset_writers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    remote = moto_s3("bcl-wds") + "/train"
    dataset_writers[1](remote, 200, maxcount=23)
    config = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=4)
    dataset = WDSPackDataset(remote, config, 0, cache_dir=tmp_path / "c1")
    assert ids(PackLoader(dataset, num_workers=2)) == dataset.epoch_plan(0).rank_packs(0).tolist()
    argv = ["--world-size", "2", "--pack-size", "4", "--window", "3", "--seed", "4", "--json"]
    assert main(["plan", remote, *argv, "--cache-dir", str(tmp_path / "c2")]) == 0
    plan = json.loads(capsys.readouterr().out)
    argv += ["--rank", "1", "--cache-dir", str(tmp_path / "c3"), "--start-after", "4"]
    assert main(["read", remote, *argv]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["packs"] == plan["ranks"][1]["packs"][4:]


def test_image_text_components_are_fetched_with_the_index(  # type: ignore[no-untyped-def]
    moto_s3, dataset_writers, tmp_path: Path
) -> None:
    """A remote image-text dataset read under a two-term cost model: the reader fetches
    ``bcl_components.npz`` beside the cost index into its cache (it used to fetch only the
    costs, so the components were missing) and plans what the local copy plans."""
    remote = moto_s3("bcl-vlm") + "/train"
    dataset_writers[0](remote, 200, images=True)
    local = tmp_path / "local"
    dataset_writers[0](local, 200, images=True)
    config = ReaderConfig.build(
        world_size=2, ranks_per_node=2, pack_size=4, window=3, cost_model="qwen2-vl-2b"
    )
    cache = tmp_path / "cache"
    dataset = MDSPackDataset(remote, config, 1, cache_dir=cache)
    assert (cache / "bcl_components.npz").is_file()
    want = MDSPackDataset(local, config, 1).epoch_plan(0).rank_packs(1).tolist()
    assert dataset.epoch_plan(0).rank_packs(1).tolist() == want
    assert ids(PackLoader(dataset)) == want
