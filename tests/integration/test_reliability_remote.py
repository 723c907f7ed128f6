"""Remote faults: an ``s3://`` dataset on a loopback moto server, read through a proxy that
fails requests on demand (``bcl_bench/faulty_proxy.py``).

- a few failed requests are absorbed by bounded retries: every record is read exactly once;
- a server that stops mid-epoch gives our DatasetError naming the dataset and the shard after a
  bounded number of requests (no hang), and the run resumes from its last state once the server
  is back, yielding exactly the packs of the uninterrupted epoch;
- an unreachable cost index is a CostIndexError naming the URL.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import write_mds
from pack_oracles import check_epoch
from resume_harness import check_resumed_log

from bcl_bench.faulty_proxy import FaultyProxy
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import CostIndexError, DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.loading.loader import PackLoader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, seed=3, shard_group=2)
"""Small shuffle blocks: the epoch walks shard after shard, so shards download mid-epoch."""
MAX_FAILED_REQUESTS = 40
"""A stopped server may see this many requests before the reader gives up (boto retries x
streaming's download_retry x the prefetch thread): a bound, not a target."""


def proxied(moto_s3, monkeypatch: pytest.MonkeyPatch, prefix: str, write, n: int):  # type: ignore[no-untyped-def]
    """(remote URL, proxy): ``n`` records written straight to moto by ``write``; reads go
    through the fault-injecting proxy."""
    import os

    remote = moto_s3(f"{prefix}-{os.getpid()}-{id(monkeypatch) % 10_000}") + "/train"
    write(remote, n)
    proxy = FaultyProxy(urlparse(os.environ["S3_ENDPOINT_URL"]).port or 0)
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    return remote, proxy


@pytest.fixture
def s3_dataset(moto_s3, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """(remote URL, proxy): 200 MDS records on moto, read through the proxy."""
    remote, proxy = proxied(moto_s3, monkeypatch, "rel", write_mds, 200)
    yield remote, proxy
    proxy.close()


def read_until_down(dataset, proxy, match: str):  # type: ignore[no-untyped-def]
    """Read 8 packs, stop the server, read on until the DatasetError matching ``match``.
    Returns (packs read, the last state, requests seen before the stop, the error)."""
    loader = PackLoader(dataset)
    got: list[list[int]] = []
    it = iter(loader)
    for _ in range(8):
        got.append(ids(next(it)))
    state = loader.state_dict()
    proxy.set_down(True)
    before = proxy.counts()[1]
    with pytest.raises(DatasetError, match=match) as caught:
        for pack in it:
            got.append(ids(pack))
            state = loader.state_dict()
    del it
    return got, state, before, caught.value


def resume_after_outage(  # type: ignore[no-untyped-def]
    proxy,
    before: int,
    dataset,
    got: list[list[int]],
    state: dict,
    plan: list[list[int]],
    n_records: int,
) -> None:
    """After a read failed on a stopped remote: a bounded number of requests was tried; with
    the remote back, a loader resumed from the last state yields exactly the rest of the plan,
    and the epoch holds each of the ``n_records`` records once."""
    failed = proxy.counts()[1] - before
    assert 0 < failed <= MAX_FAILED_REQUESTS
    proxy.set_down(False)
    resumed = PackLoader(dataset)
    resumed.load_state_dict(state)
    assert state["packs_consumed"] == len(got)
    assert got == plan[: len(got)]
    rest = [ids(pack) for pack in resumed]
    check_resumed_log(plan, len(got), rest)
    got += rest
    check_epoch([got], n_records, pack_size=4, left_out=0)  # every record once, none lost


def ids(pack: list[dict]) -> list[int]:  # type: ignore[type-arg]
    return [int(s["sample_id"]) for s in pack]


def test_transient_failures_are_retried(s3_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_dataset
    proxy.fail_next(3)  # the cost index download
    dataset = MDSPackDataset(
        remote, CONFIG, 0, cache_dir=tmp_path / "cache", options=ReadOptions(prefetch=1)
    )
    assert proxy.counts()[1] == 3
    plan = dataset.epoch_plan(0).rank_packs(0).tolist()
    proxy.fail_next(2, path_contains="shard.")  # shard downloads
    got = [ids(pack) for pack in PackLoader(dataset)]
    assert got == plan
    check_epoch([got], 200, pack_size=4, left_out=0)
    assert proxy.counts()[1] == 5


def test_server_down_mid_epoch_then_resume(s3_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_dataset
    dataset = MDSPackDataset(
        remote, CONFIG, 0, cache_dir=tmp_path / "cache", options=ReadOptions(prefetch=1)
    )
    plan = dataset.epoch_plan(0).rank_packs(0).tolist()
    match = rf"{remote}: cannot read record \d+ \(shard \d+, shard\.\d+\.mds\).*resume from the last checkpoint"  # fmt: skip
    got, state, before, _ = read_until_down(dataset, proxy, match)
    resume_after_outage(proxy, before, dataset, got, state, plan, 200)


def test_unreachable_cost_index_is_named(s3_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_dataset
    proxy.set_down(True)
    with pytest.raises(CostIndexError, match=rf"{remote}/bcl_index\.json: cannot fetch.*failed after \d+ attempts"):  # fmt: skip
        MDSPackDataset(remote, CONFIG, 0, cache_dir=tmp_path / "cache")
    assert 0 < proxy.counts()[1] <= MAX_FAILED_REQUESTS


# -- WebDataset, inspect and annotate over the same faults ------------------------------
WDS_CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, seed=3, shard_group=2)


@pytest.fixture
def s3_wds(moto_s3, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """(remote URL, proxy): a 300-record WebDataset (9 shards) on moto, read through the proxy."""
    from conftest import write_wds

    remote, proxy = proxied(moto_s3, monkeypatch, "relw", write_wds, 300)
    yield remote, proxy
    proxy.close()


def wds_dataset(remote: str, cache: Path):  # type: ignore[no-untyped-def]
    from bcl_stream.formats.wds_reader import WDSPackDataset

    return WDSPackDataset(remote, WDS_CONFIG, 0, cache_dir=cache, options=ReadOptions(prefetch=0))


def test_wds_transient_failures_are_retried(s3_wds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_wds
    proxy.fail_next(3)  # the cost index download
    dataset = wds_dataset(remote, tmp_path / "cache")
    assert proxy.counts()[1] == 3
    plan = dataset.epoch_plan(0).rank_packs(0).tolist()
    proxy.fail_next(2, path_contains="shard-")
    got = [ids(pack) for pack in PackLoader(dataset)]
    assert got == plan
    assert proxy.counts()[1] == 5


def test_wds_server_down_mid_epoch_then_resume(s3_wds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_wds
    dataset = wds_dataset(remote, tmp_path / "cache")
    plan = dataset.epoch_plan(0).rank_packs(0).tolist()
    match = rf"^{remote}: cannot read shard \d+ \(shard-\d+\.tar\): download of .* failed after 4 attempts: .*503.*resume from the last checkpoint\.$"  # fmt: skip
    got, state, before, error = read_until_down(dataset, proxy, match)
    assert "\n" not in str(error)
    resume_after_outage(proxy, before, dataset, got, state, plan, 300)


def test_inspect_and_annotate_on_a_faulty_remote(s3_wds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A few failed requests are retried; a server that is down gives one line naming the URL
    after a bounded number of requests; once it is back the same command succeeds."""
    from bcl_stream.analysis.inspection import inspect_dataset
    from bcl_stream.preprocess.annotate import annotate

    remote, proxy = s3_wds
    proxy.fail_next(3)
    report = inspect_dataset(remote)
    assert report["ok"] and report["records"] == 300 and proxy.counts()[1] == 3
    proxy.fail_next(3, path_contains="shard-")
    assert len(annotate(remote, cost_model="tokens", overwrite=True, progress=False)) == 300

    proxy.set_down(True)
    before = proxy.counts()[1]
    report = inspect_dataset(remote)
    assert not report["ok"] and len(report["problems"]) == 1
    assert re.match(
        rf"listing of {remote} failed after 4 attempts: .*(503|ServiceUnavailable)",
        report["problems"][0],
    )
    with pytest.raises(DatasetError, match=rf"listing of {remote} failed after 4 attempts"):
        annotate(remote, cost_model="tokens", overwrite=True, progress=False)
    assert 0 < proxy.counts()[1] - before <= 2 * MAX_FAILED_REQUESTS

    proxy.set_down(False)
    annotate(remote, cost_model="tokens", overwrite=True, progress=False)
    assert inspect_dataset(remote)["ok"]
    plan = wds_dataset(remote, tmp_path / "c2").epoch_plan(0).rank_packs(0).tolist()
    assert [ids(p) for p in PackLoader(wds_dataset(remote, tmp_path / "c2"))] == plan


# -- a store that accepts connections and never answers: the download deadline ---------------
STALL_OPTIONS = ReadOptions(prefetch=1, download_timeout=3.0, download_attempts=2)
"""Deadline 2 attempts x 3 s: a stalled shard ends the read in seconds, not 12 minutes."""


def read_until_stalled(dataset, proxy, shard_path: str):  # type: ignore[no-untyped-def]
    """Stall every request for a shard, read the epoch; (the error, seconds to get it)."""
    import time

    proxy.stall(shard_path)
    t0 = time.monotonic()
    with pytest.raises(DatasetError) as caught:
        for _ in PackLoader(dataset):
            pass
    seconds = time.monotonic() - t0
    proxy.stall(None)
    return caught.value, seconds


def test_stalled_mds_shard_ends_at_the_deadline(s3_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_dataset
    dataset = MDSPackDataset(remote, CONFIG, 0, cache_dir=tmp_path / "cache", options=STALL_OPTIONS)
    assert dataset.streaming.streams[0].download_retry == 1  # the attempts reach streaming
    error, seconds = read_until_stalled(dataset, proxy, "shard.")
    message = str(error)
    assert "\n" not in message and proxy.stalled >= 1
    assert re.match(
        rf"{remote}: cannot read record \d+ \(shard \d+, shard\.\d+\.mds\): download stalled: "
        r"not done within the deadline of 2 attempts x 3 s \(download_attempts x "
        r"download_timeout\) = 6 s\. .*resume from the last checkpoint",
        message,
    ), message
    assert seconds < 30  # the deadline (6 s), twice at most (a prefetch then the read)


def test_stalled_wds_shard_ends_at_the_deadline(s3_wds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from bcl_stream.formats.wds_reader import WDSPackDataset

    remote, proxy = s3_wds
    dataset = WDSPackDataset(
        remote, WDS_CONFIG, 0, cache_dir=tmp_path / "cache", options=STALL_OPTIONS
    )
    error, seconds = read_until_stalled(dataset, proxy, "shard-")
    message = str(error)
    assert "\n" not in message and proxy.stalled >= 2, message
    assert re.match(
        rf"{remote}: cannot read shard \d+ \(shard-\d+\.tar\): download of {remote}/shard-\d+\.tar "
        r"stalled: no answer within the deadline of 2 attempts x 3 s \(download_attempts x "
        r"download_timeout\) = 6 s\. .*resume from the last checkpoint\.",
        message,
    ), message
    assert seconds < 30
    assert not list((tmp_path / "cache").glob("shard-*.tar.*"))  # no partial file left


def test_stalled_cost_index_ends_at_the_deadline(s3_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    remote, proxy = s3_dataset
    proxy.stall("bcl_index.json")
    with pytest.raises(CostIndexError, match=r"bcl_index\.json: cannot fetch.*stalled.*attempts x"):
        MDSPackDataset(remote, CONFIG, 0, cache_dir=tmp_path / "cache", options=STALL_OPTIONS)
    proxy.stall(None)
