"""Readers follow the plan: MDS and WebDataset, every scope, workers 0, 2 and 4.

Invariants, not examples: for every rank the loader yields exactly the plan's packs; over all
ranks every record appears once, or in the reported remainder; every pack has exactly B
records; every rank has the same ``len()``; the records read are the ones named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pack_oracles import check_every_record_once
from two_term_reference import check_two_terms_refined

from bcl_stream.cli import main
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError, StateError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.loading.loader import PackLoader

pytestmark = pytest.mark.slow


def open_reader(fmt: str, root: Path, config: ReaderConfig, rank: int) -> PlanDataset:
    if fmt == "mds":
        return MDSPackDataset(root, config, rank)
    return WDSPackDataset(root, config, rank)


def read_ids(loader: PackLoader) -> list[list[int]]:
    packs = []
    for pack in loader:
        for sample in pack:
            # Record i was written as [i] * L_i: the reader returned the record it names.
            assert np.all(sample["input_ids"] == sample["sample_id"])
        packs.append([int(s["sample_id"]) for s in pack])
    return packs


SCOPE_WORKERS = [("rank", 0), ("rank", 2), ("node", 0), ("node", 2), ("node", 4)]
"""(scope, DataLoader workers) both formats are read under, plus scope world once each."""
CASES = [(fmt, scope, workers) for fmt in ("mds", "wds") for scope, workers in SCOPE_WORKERS]
CASES += [("mds", "world", 0), ("wds", "world", 2)]


IMAGE_CASES = [("mds", "rank", 0), ("wds", "rank", 2), ("mds", "node", 2), ("wds", "world", 0)]
"""Image-text components under a two-term cost model: the readers refine (every scope)."""


@pytest.mark.parametrize(
    ("fmt", "scope", "workers", "images"),
    [(*case, False) for case in CASES] + [(*case, True) for case in IMAGE_CASES],
)
def test_every_rank_yields_its_plan_and_records_are_used_once(
    fmt: str,
    scope: str,
    workers: int,
    images: bool,
    mds_dir: Path,
    wds_dir: Path,
    vlm_dirs: dict[str, Path],
) -> None:
    root = vlm_dirs[fmt] if images else mds_dir if fmt == "mds" else wds_dir
    config = ReaderConfig.build(
        world_size=4,
        ranks_per_node=2,
        pack_size=3,
        window=4,
        scope=scope,
        cost_model="qwen2-vl-2b" if images else None,
    )
    seen: list[int] = []
    lengths = set()
    for rank in range(config.plan.world_size):
        dataset = open_reader(fmt, root, config, rank)
        loader = PackLoader(dataset, num_workers=workers)
        loader.set_epoch(1)
        lengths.add(len(loader))
        packs = read_ids(loader)
        assert packs == dataset.epoch_plan(1).rank_packs(rank).tolist()
        # the reader's lazy, window-by-window plan is the whole-epoch plan
        assert packs == full_plan(dataset.index, config, 1).rank_packs(rank).tolist()
        assert len(packs) == len(loader)
        assert all(len(p) == config.plan.pack_size for p in packs)
        seen += [i for p in packs for i in p]
    assert len(lengths) == 1
    left = full_plan(dataset.index, config, 1).plan.remainder
    assert sum(dataset.remainder_counts().values()) == sum(ids.size for ids in left.values())
    check_every_record_once(seen, 300, left_out=left)
    if images:
        check_two_terms_refined(
            dataset.index, config, full_plan(dataset.index, config, 1).plan.packs, 1
        )


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_persistent_workers_follow_new_epochs(fmt: str, mds_dir: Path, wds_dir: Path) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    config = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=5)
    dataset = open_reader(fmt, root, config, 1)
    loader = PackLoader(dataset, num_workers=2, persistent_workers=True)
    epochs = [read_ids(loader) for _ in range(3)]
    for epoch, packs in enumerate(epochs):
        assert packs == dataset.epoch_plan(epoch).rank_packs(1).tolist()
    assert epochs[0] != epochs[1] != epochs[2]
    assert loader.state_dict()["epoch"] == 3


def test_set_epoch_restarts_and_len_is_exact(mds_dir: Path) -> None:
    config = ReaderConfig.build(world_size=3, pack_size=5, window=2, seed=1)
    loader = PackLoader(MDSPackDataset(mds_dir, config, 2))
    it = iter(loader)
    next(it)
    loader.set_epoch(4)
    packs = read_ids(loader)
    assert packs == loader.plan_dataset.epoch_plan(4).rank_packs(2).tolist()
    plan = loader.plan_dataset.epoch_plan(4)
    assert len(loader) == len(packs) == plan.n_packs > 0
    # every node reads only its own shards: what the shortest node cannot fill is the tail
    assert plan.n_packs * 3 * 5 + sum(plan.remainder_counts().values()) == 300


def test_cli_read_equals_cli_plan(mds_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--world-size", "2", "--pack-size", "4", "--window", "3", "--seed", "3"]
    assert main(["plan", str(mds_dir), *common, "--scope", "world", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    assert plan["remainder"]["count"] == 300 - 2 * len(plan["ranks"][0]["packs"]) * 4
    assert plan["remainder"]["reason"] == "epoch_tail"
    argv = ["read", str(mds_dir), *common, "--scope", "world", "--rank", "1", "--json"]
    assert main([*argv, "--num-workers", "2"]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["packs"] == plan["ranks"][1]["packs"]
    assert (read["rank"], read["world_size"], read["nodes"]) == (1, 2, plan["nodes"])
    assert main([*argv, "--start-after", "7", "--packs", "5"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["packs"] == plan["ranks"][1]["packs"][7:12]


def test_cli_read_wds_at_node_scope_equals_plan(
    wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--world-size", "2", "--ranks-per-node", "2", "--pack-size", "2", "--window", "2"]
    assert main(["plan", str(wds_dir), *common, "--scope", "node", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    argv = ["read", str(wds_dir), *common, "--scope", "node", "--rank", "1", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["packs"] == plan["ranks"][1]["packs"]


def test_wds_shard_with_missing_records_is_reported(wds_dir: Path, tmp_path: Path) -> None:
    import io
    import tarfile

    broken = tmp_path / "ds"
    shutil.copytree(wds_dir, broken)
    shard = broken / "shard-000002.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(shard, "w") as tar:
        for member, data in members[:-2]:  # drop the last record's two members
            tar.addfile(member, io.BytesIO(data))
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2, shuffle=False)
    with pytest.raises(DatasetError, match=r"shard-000002\.tar: holds 36 records but the cost"):
        read_ids(PackLoader(WDSPackDataset(broken, config, 0)))


def test_mds_index_mismatch_is_reported(mds_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(mds_dir, other)
    meta = json.loads((other / "index.json").read_text())
    meta["shards"] = meta["shards"][:-1]
    (other / "index.json").write_text(json.dumps(meta))
    config = ReaderConfig.build(world_size=1, pack_size=2, window=2)
    with pytest.raises(DatasetError, match=r"index\.json and bcl_index\.json disagree"):
        MDSPackDataset(other, config, 0)


def test_memory_cap_reports_long_records_and_caps_packs(mds_dir: Path) -> None:
    config = ReaderConfig.build(world_size=2, pack_size=1, window=4, max_tokens=60, scope="world")
    seen: list[int] = []
    for rank in range(2):
        dataset = MDSPackDataset(mds_dir, config, rank)
        for pack in read_ids(PackLoader(dataset)):
            assert int(dataset.index.tokens[pack].sum()) <= 60
            seen += pack
    counts = dataset.remainder_counts()
    assert counts["longer_than_max_tokens"] == int((dataset.index.tokens > 60).sum()) > 0
    whole = full_plan(dataset.index, config, 0).plan
    check_every_record_once(seen, 300, left_out=whole.remainder)


def test_bcl_packs_stage_in_a_stock_webdataset_pipeline(wds_dir: Path) -> None:
    import webdataset as wds

    from bcl_stream.formats.wds_reader import bcl_packs

    config = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=8)
    dataset = WDSPackDataset(wds_dir, config, 1)
    # Shards in the order the plan first needs them keep the stage's buffer small.
    urls = [
        str(wds_dir / dataset.index.shards[s].name)
        for s in dataset.shard_order(dataset.epoch_plan(2).rank_packs(1))
    ]
    stage = wds.pipelinefilter(bcl_packs)(index=dataset.index, config=config, rank=1, epoch=2)
    pipe = wds.DataPipeline(
        wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode(), stage
    )
    packs = [[int(s["__key__"]) for s in pack] for pack in pipe]
    assert packs == dataset.epoch_plan(2).rank_packs(1).tolist()


def test_cli_read_resumes_into_the_next_epoch_and_refuses_past_it(
    wds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--world-size", "2", "--pack-size", "4", "--window", "3", "--json"]
    assert main(["plan", str(wds_dir), *common, "--epoch", "1"]) == 0
    next_epoch = json.loads(capsys.readouterr().out)["ranks"][0]["packs"]
    n = len(next_epoch)
    argv = ["read", str(wds_dir), *common, "--rank", "0"]
    assert main([*argv, "--start-after", str(n), "--packs", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["packs"] == next_epoch[:3]
    assert main([*argv, "--start-after", str(n + 1)]) == 2
    assert f"--start-after {n + 1} is past the epoch end ({n} packs per rank)" in (
        capsys.readouterr().err
    )
    assert main(["plan", str(wds_dir), *common[:-1]]) == 0
    assert "packs per rank 37" in capsys.readouterr().out


def test_loader_reports_the_remainder_each_epoch(
    mds_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ReaderConfig.build(world_size=2, pack_size=4, window=3)
    loader = PackLoader(MDSPackDataset(mds_dir, config, 0))
    with caplog.at_level("INFO", logger="bcl_stream.loading.loader"):
        read_ids(loader)
    assert "epoch 0: 37 packs per rank; 4 records not yielded this epoch (epoch_tail: 4)" in (
        caplog.text
    )


def test_a_two_term_reader_costs_its_records_once(
    vlm_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building a reader's plan under a two-term model computes each record's two terms
    once (its planning costs and its refinement share them), however many plans use them."""
    from bcl_stream.epoch import cache
    from bcl_stream.epoch.plan import reader_plan
    from bcl_stream.io.index import read_index
    from bcl_stream.vision.cost import TwoTermCost

    calls: list[int] = []
    terms = TwoTermCost.terms
    monkeypatch.setattr(TwoTermCost, "terms", lambda self, c: calls.append(1) or terms(self, c))
    cache.clear()
    index = read_index(vlm_dirs["mds"])
    config = ReaderConfig.build(world_size=4, ranks_per_node=2, pack_size=3, window=4,
                                cost_model="qwen2-vl-2b")  # fmt: skip
    for epoch in (0, 1):
        assert reader_plan(index, config, epoch).rank_packs(0).size
    assert calls == [1]
    cache.clear()


@pytest.mark.parametrize("contract", ["pack", "tokens"])
def test_two_term_units_are_refined_alike_on_every_plan_path(
    contract: str, vlm_dirs: dict[str, Path]
) -> None:
    """The two-term refinement regroups windows and guards units of several windows
    (``planner/two_term.py``): a reader starting mid-unit, the elastic resume's first packs
    and the whole-epoch plan all refine whole units from a unit's start, so they agree."""
    budget = {"contract": "tokens", "max_tokens": 64} if contract == "tokens" else {}
    config = ReaderConfig.build(
        world_size=2, ranks_per_node=2, pack_size=2, window=1, seed=3, grad_accum=1,
        cost_model="qwen2-vl-2b", **budget,
    )  # fmt: skip
    dataset = open_reader("mds", vlm_dirs["mds"], config, 0)
    plan = dataset.epoch_plan(0)
    whole = full_plan(dataset.index, config, 0).plan.packs
    assert plan.n_packs > 2 * 16  # more than two units of 16 windows

    def ids(packs: np.ndarray) -> list[list[int]]:
        return [[i for i in p if i >= 0] for p in packs.tolist()]

    for rank in range(config.plan.world_size):
        for start in (0, 5, 17, 33):
            got = [p for _, batch in plan.iter_rank_packs(rank, start) for p in ids(batch)]
            assert got == ids(whole[rank, start:])
    for k in (5, 17, plan.n_packs):
        first = plan.first_packs(k)
        assert [ids(r) for r in first] == [ids(r) for r in whole[:, :k]]


def test_the_two_term_slack_reaches_the_refinement_and_a_resume_keeps_it(
    vlm_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan.two_term_slack`` is what the readers' refinement guards with (0 by default: never
    below the token-only plan), and a reader state saved under one slack is refused by a loader
    set to another, naming it (the plans differ)."""
    from bcl_stream.epoch import cache, terms

    seen: list[float] = []
    refine = terms.refine_packs

    def spy(*args: object, **kwargs: object) -> np.ndarray:
        seen.append(float(kwargs["slack"]))  # type: ignore[arg-type]
        return refine(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(terms, "refine_packs", spy)
    layout = {"world_size": 2, "ranks_per_node": 2, "pack_size": 2, "window": 2, "seed": 1}
    datasets = {}
    for slack in (0.0, 0.05):
        cache.clear()
        config = ReaderConfig.build(**layout, cost_model="qwen2-vl-2b", two_term_slack=slack)
        datasets[slack] = open_reader("mds", vlm_dirs["mds"], config, 0)
        assert datasets[slack].epoch_plan(0).rank_packs(0).size
        assert seen and set(seen) == {slack}
        seen.clear()
    state = PackLoader(datasets[0.05]).state_dict()
    with pytest.raises(StateError, match=r"two_term_slack=0\.05"):
        PackLoader(datasets[0.0]).load_state_dict(state)
    cache.clear()
