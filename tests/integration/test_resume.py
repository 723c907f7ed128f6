"""Resume equals the uninterrupted run: at every position of a small epoch, at the epoch end,
and into the next epoch; for MDS and WebDataset, workers 0 and 2, persistent workers; plus
elastic resume under another world size. The comparison is the shared harness's
(``tests/resume_harness.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pack_oracles import check_every_record_once
from resume_harness import pack_key, run_elastic_resume, run_test_save_load_state, take

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig, Segment
from bcl_stream.errors import StateError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.loading.loader import PackLoader
from bcl_stream.process_layout import ProcessLayout

pytestmark = pytest.mark.slow


_DATASETS: dict[tuple[str, Path, ReaderConfig, int], PlanDataset] = {}


def _dataset(fmt: str, root: Path, config: ReaderConfig, rank: int) -> PlanDataset:
    """A dataset at epoch 0, pack 0, as a restarted job builds it.

    Reused across loaders: each StreamingDataset keeps ~40 shared-memory descriptors for the
    life of the process, so a test that builds hundreds would run out of file descriptors.
    """
    key = (fmt, root, config, rank)
    if key not in _DATASETS:
        cls = MDSPackDataset if fmt == "mds" else WDSPackDataset
        _DATASETS[key] = cls(root, config, rank)
    return _DATASETS[key]  # a new loader starts it at pack 0 of epoch 0


CONFIG = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=11)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_resume_at_every_position(fmt: str, mds_dir: Path, wds_dir: Path) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    run_test_save_load_state(lambda: PackLoader(_dataset(fmt, root, CONFIG, 1)))


@pytest.mark.parametrize(("fmt", "persistent"), [("mds", False), ("wds", True)])
def test_resume_with_workers(fmt: str, persistent: bool, mds_dir: Path, wds_dir: Path) -> None:
    root = mds_dir if fmt == "mds" else wds_dir

    def make() -> PackLoader:
        dataset = _dataset(fmt, root, CONFIG, 0)
        return PackLoader(dataset, num_workers=2, persistent_workers=persistent)

    run_test_save_load_state(make, positions=[0, 1, 5, 36, 37, 38])


def test_world_scope_resume(mds_dir: Path) -> None:
    config = ReaderConfig.build(
        world_size=3, ranks_per_node=3, pack_size=2, window=5, scope="world"
    )
    run_test_save_load_state(
        lambda: PackLoader(_dataset("mds", mds_dir, config, 2)), positions=[3, 49, 50, 51]
    )


def test_state_is_identical_on_every_rank(mds_dir: Path) -> None:
    states = []
    for rank in range(CONFIG.plan.world_size):
        loader = PackLoader(_dataset("mds", mds_dir, CONFIG, rank))
        take(loader, 6)
        states.append(loader.state_dict())
    assert states[0] == states[1]
    assert states[0]["packs_consumed"] == 6


def test_state_from_other_data_or_config_is_refused(mds_dir: Path, wds_dir: Path) -> None:
    loader = PackLoader(MDSPackDataset(mds_dir, CONFIG, 0))
    take(loader, 2)
    state = loader.state_dict()
    with pytest.raises(StateError, match="saved on other data"):
        PackLoader(WDSPackDataset(wds_dir, CONFIG, 0)).load_state_dict(state)
    other = ReaderConfig.build(**{**CONFIG.flat(), "seed": 12})
    with pytest.raises(StateError, match="saved with seed=11 but the loader has seed=12"):
        PackLoader(MDSPackDataset(mds_dir, other, 0)).load_state_dict(state)
    with pytest.raises(StateError, match="this plan has 37 per rank"):
        PackLoader(MDSPackDataset(mds_dir, CONFIG, 0)).load_state_dict(
            {**state, "packs_consumed": 99}
        )


@pytest.mark.parametrize(("old", "new", "after"), [(2, 3, 10), (3, 2, 0), (4, 1, 1)])
def test_elastic_resume_uses_every_record_once(
    old: int, new: int, after: int, mds_dir: Path
) -> None:
    config = ReaderConfig.build(world_size=old, pack_size=4, window=3, seed=2)
    resized = config.resized(ProcessLayout(world_size=new, ranks_per_node=1))
    run = run_elastic_resume(
        lambda c, rank: PackLoader(_dataset("mds", mds_dir, c, rank)),
        config,
        resized,
        old,
        new,
        after,
    )
    for loader in run.resumed:  # the elastic epoch ended; next is a full one
        assert loader.state_dict()["epoch"] == 1
        assert loader.state_dict()["segments"] == []
    assert len(run.lengths) == 1
    dataset = run.resumed[-1].plan_dataset
    left = full_plan(dataset.index, resized, 0, dataset.segments).plan.remainder
    check_every_record_once(run.ids, 300, left_out=left)
    with pytest.raises(StateError, match="elastic resume is disabled"):
        PackLoader(MDSPackDataset(mds_dir, resized, 0), allow_resize=False).load_state_dict(
            run.state
        )


def test_elastic_state_reaches_live_persistent_workers(mds_dir: Path) -> None:
    old = ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=2)
    saver = PackLoader(_dataset("mds", mds_dir, old, 0))
    take(saver, 4)
    state = saver.state_dict()
    config = old.resized(ProcessLayout(world_size=3, ranks_per_node=1))
    dataset = _dataset("mds", mds_dir, config, 1)
    loader = PackLoader(dataset, num_workers=2, persistent_workers=True)
    assert [pack_key(p) for p in loader] == [tuple(r) for r in dataset.epoch_plan(0).rank_packs(1)]
    loader.load_state_dict(state)  # the workers are alive and hold the old (no) segments
    expected = dataset.epoch_plan(0, (Segment(2, 1, 4),)).rank_packs(1)
    assert [pack_key(p) for p in loader] == [tuple(r) for r in expected]
    assert len(expected) < len(dataset.epoch_plan(1).rank_packs(1))


def test_a_canonical_layout_is_adopted_from_the_cursor(mds_dir: Path) -> None:
    """Saved on 1 node of 2 ranks with canonical_ranks_per_node unpinned (so 2, the physical
    ranks per node, recorded in the cursor); resumed on 2 nodes of 1 rank with nothing pinned:
    the saved canonical layout is adopted, every optimizer step after the resume is the
    uninterrupted run's and every record of the epoch is yielded once across the boundary. A
    persistent worker started before the resume reads under the adopted layout too."""
    common: dict[str, Any] = {
        "pack_size": 4, "window": 3, "seed": 5, "scope": "world", "grad_accum": 1,
        "world_size": 2, "canonical_ranks": 2,
    }  # fmt: skip
    saved_layout = ReaderConfig.build(ranks_per_node=2, **common)
    new_layout = ReaderConfig.build(ranks_per_node=1, **common)
    assert new_layout.canonical_node_ranks == 1  # what a fresh run on the new nodes would use
    # the uninterrupted run: one micro-batch per rank per optimizer step (G_c * V/R = 1)
    whole = [
        [pack_key(p) for p in PackLoader(MDSPackDataset(mds_dir, saved_layout, r))] for r in (0, 1)
    ]
    steps = [sorted(pair) for pair in zip(*whole, strict=True)]
    k = len(steps) // 3
    before, state = [], {}
    for rank in (0, 1):
        first = PackLoader(MDSPackDataset(mds_dir, saved_layout, rank))
        before.append(take(first, k)[0])
        state = json.loads(json.dumps(first.state_dict()))  # the same on every rank
    assert state["config"]["canonical_ranks_per_node"] == 2
    after = []
    for rank in (0, 1):
        dataset = MDSPackDataset(mds_dir, new_layout, rank)
        loader = PackLoader(dataset, num_workers=rank * 2, persistent_workers=rank == 1)
        if rank == 1:
            list(loader)  # the workers are alive and hold the unpinned (physical) layout
        loader.load_state_dict(state)
        assert dataset.config.canonical_ranks_per_node is None  # the reader built unpinned
        dataset = loader.plan_dataset  # reads on through a reader built with the adopted one
        assert dataset.config.canonical_ranks_per_node == 2
        after.append([pack_key(p) for p in loader])
    runs = [b + a for b, a in zip(before, after, strict=True)]
    got = [sorted(pair) for pair in zip(*runs, strict=True)]
    assert got == steps
    left = full_plan(dataset.index, dataset.config, 0).plan.remainder
    check_every_record_once(before + after, 300, left_out=left)
    pinned = ReaderConfig.build(ranks_per_node=1, canonical_ranks_per_node=1, **common)
    with pytest.raises(
        StateError,
        match=r"saved with canonical_ranks_per_node=2 but the loader sets "
        r"canonical_ranks_per_node=1",
    ):
        PackLoader(MDSPackDataset(mds_dir, pinned, 0)).load_state_dict(state)
