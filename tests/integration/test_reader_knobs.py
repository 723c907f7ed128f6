"""Reader knobs users of Mosaic Streaming expect (issue "the user's path, second pass", point
7): ``cache_limit``, ``download_timeout`` and a prefetch depth, on both readers and the
DataModule, from ``s3://`` on the local moto server.

- MDS: Mosaic Streaming owns its cache: the values reach its ``StreamingDataset`` as given;
- WebDataset: the reader's own cache keeps at most ``cache_limit`` bytes of the tars it
  downloaded (plus the ones it reads and fetches ahead) and still yields exactly the plan;
- the DataModule passes them to the readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.read_options import ReadOptions, size_bytes
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=3, seed=1)


def test_mds_knobs_reach_streaming(moto_s3, dataset_writers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote = moto_s3("bcl-knobs-mds") + "/train"
    dataset_writers[0](remote, 120)
    options = ReadOptions(cache_limit="64mb", download_timeout=7.5, prefetch=1)
    dataset = MDSPackDataset(remote, CONFIG, 0, cache_dir=tmp_path / "cache", options=options)
    assert dataset.streaming.cache_limit == size_bytes("64mb")
    assert dataset.streaming.streams[0].download_timeout == 7.5
    assert dataset.prefetch == 1
    got = [[int(s["sample_id"]) for s in pack] for pack in PackLoader(dataset)]
    assert got == dataset.epoch_plan(0).rank_packs(0).tolist()


def test_wds_cache_limit_evicts_and_yields_the_plan(  # type: ignore[no-untyped-def]
    moto_s3, dataset_writers, tmp_path: Path
) -> None:
    remote = moto_s3("bcl-knobs-wds") + "/train"
    dataset_writers[1](remote, 240, maxcount=20)  # 12 tars
    cache = tmp_path / "cache"
    unlimited = WDSPackDataset(remote, CONFIG, 0, cache_dir=tmp_path / "all")
    plan = [[int(s["sample_id"]) for s in pack] for pack in PackLoader(unlimited)]
    tars = sorted((tmp_path / "all").glob("*.tar"))
    assert len(tars) == 12
    one = max(p.stat().st_size for p in tars)
    options = ReadOptions(cache_limit=2 * one, download_timeout=5.0, prefetch=1)
    dataset = WDSPackDataset(remote, CONFIG, 0, cache_dir=cache, options=options)
    seen_most = 0
    got = []
    for pack in PackLoader(dataset):
        got.append([int(s["sample_id"]) for s in pack])
        seen_most = max(seen_most, len(list(cache.glob("*.tar"))))
        assert all(np.all(s["input_ids"] == s["sample_id"]) for s in pack)
    assert got == plan  # eviction changes nothing a rank yields
    # at most the limit's 2 tars, plus a pack's own shards (fetched side by side, kept while
    # it is read) and the one fetched ahead; never every tar
    widest = max(len({sid // 20 for sid in pack}) for pack in plan)  # 20 records per tar
    assert 0 < seen_most <= 2 + widest + 1 < 12
    assert len(list(cache.glob("*.tar"))) < 12


def test_datamodule_passes_the_knobs(moto_s3, dataset_writers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from lightning_module import BCLDataModule

    remote = moto_s3("bcl-knobs-dm") + "/train"
    dataset_writers[0](remote, 60)
    module = BCLDataModule(
        remote, cache_dir=str(tmp_path / "c"), plan={"pack_size": 4, "window": 2},
        read={"cache_limit": "1gb", "download_timeout": 9.0, "prefetch": 3},
    )  # fmt: skip
    module.setup_for(0, 1, 1)
    dataset = module.dataset
    assert isinstance(dataset, MDSPackDataset)
    assert (
        dataset.streaming.cache_limit == 1 << 30
        and dataset.streaming.streams[0].download_timeout == 9.0
    )
    assert dataset.prefetch == 3
    with pytest.raises(ValueError, match="cache_limit must be a byte count"):
        BCLDataModule(remote, read={"cache_limit": "lots"})
    with pytest.raises(ValueError, match="prefetch must be an integer >= 0"):
        BCLDataModule(remote, read={"prefetch": -1})
