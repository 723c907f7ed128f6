"""``contract="tokens"`` through the real readers in the layouts beyond the packed one
(MDS and WebDataset): the padded layout (rows x longest record <= T) and canonical ranks (the
same micro-batches per optimizer step at every R dividing V, resume across R). Its own file:
each file runs in its own process (``tools/run_tests.py``: Mosaic Streaming keeps every
shared-memory handle open until exit), and these add many readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pack_oracles import check_every_record_once
from resume_harness import DataModuleLoader, pack_key, run_test_save_load_state
from test_contract_tokens_loading import G, T, W, module, setup

from bcl_stream.epoch.full_plan import full_plan

pytestmark = pytest.mark.slow


PADDED = [("mds", "node", 2, 2), ("wds", "rank", 2, 1), ("wds", "world", 4, 2)]


@pytest.mark.parametrize(("fmt", "scope", "world", "per_node"), PADDED)
def test_padded_rows_times_longest_within_the_budget(
    mds_dir: Path, wds_dir: Path, fmt: str, scope: str, world: int, per_node: int
) -> None:
    """The padded layout: every micro-batch's rows x longest record <= T (the collate's
    (rows, longest) tensor), equal counts, every record once or reported, and a resume in
    mid-epoch with workers replays the run exactly."""
    root = mds_dir if fmt == "mds" else wds_dir
    kw: dict[str, Any] = {"format": fmt, "scope": scope, "collate": "padded"}
    modules = [setup(root, r, world, per_node, **kw) for r in range(world)]
    assert modules[0].dataset.config.plan.layout == "padded"  # type: ignore[union-attr]
    ranks = [list(dm.train_dataloader()) for dm in modules]
    counts = {len(rank) for rank in ranks}
    assert len(counts) == 1 and counts.pop() % G == 0
    for rank in ranks:
        for batch in rank:
            rows, width = batch["input_ids"].shape
            assert rows == batch["sample_ids"].numel() >= 1
            assert rows * width <= T
    ids = [int(i) for rank in ranks for b in rank for i in b["sample_ids"]]
    plan = full_plan(modules[0].dataset.index, modules[0].dataset.config, 0)  # type: ignore[union-attr]
    check_every_record_once(ids, 300, plan.plan.remainder)
    assert len({int(b["sample_ids"].numel()) for rank in ranks for b in rank}) > 1
    full = [pack_key(b) for b in ranks[world - 1]]
    run_test_save_load_state(
        lambda: DataModuleLoader(module(root, **kw), world - 1, world, per_node, grad_accum=G),
        epochs=1,
        positions=[1, G + 1, len(full) - 1],
        make_resumed=lambda: DataModuleLoader(
            module(root, workers=2, **kw), world - 1, world, per_node, grad_accum=G
        ),
        reference=[full],
    )


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_canonical_ranks_keep_the_steps_and_resume_on_another_size(
    mds_dir: Path, wds_dir: Path, fmt: str
) -> None:
    """Canonical ranks V = 4 under the token contract through the real readers: on R = 4 and
    on R = 2 every optimizer step holds the same micro-batches (each within T; a rank runs
    G * V/R per step, the same count on every rank); a state saved on R = 4 at a step boundary
    resumes on R = 2 at that step, with workers, and every record of the epoch is yielded once."""
    from resume_harness import take

    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.open_dataset import open_dataset
    from bcl_stream.loading.loader import PackLoader

    root = mds_dir if fmt == "mds" else wds_dir
    v = 4
    common: dict[str, Any] = {
        "window": W, "grad_accum": G, "contract": "tokens", "max_tokens": T, "seed": 2,
        "scope": "world", "canonical_ranks": v, "canonical_ranks_per_node": 2,
    }  # fmt: skip
    sizes = {r: ReaderConfig.build(world_size=r, ranks_per_node=2, **common) for r in (4, 2)}
    tokens = open_dataset(str(root), sizes[4], 0).index.tokens

    def run(r: int) -> list[list[tuple[int, ...]]]:
        ranks = [
            [pack_key(p) for p in PackLoader(open_dataset(str(root), sizes[r], i))]
            for i in range(r)
        ]
        assert len({len(rank) for rank in ranks}) == 1  # equal counts
        per = G * v // r
        assert len(ranks[0]) % per == 0
        for rank in ranks:
            for mb in rank:
                assert len(mb) >= 1 and sum(int(tokens[i]) for i in mb) <= T
        return [
            sorted(mb for rank in ranks for mb in rank[s : s + per])
            for s in range(0, len(ranks[0]), per)
        ]

    steps = run(4)
    assert run(2) == steps
    k = 2  # steps before the save
    before: list[list[Any]] = []
    state: dict[str, Any] = {}
    for rank in range(4):
        loader = PackLoader(open_dataset(str(root), sizes[4], rank))
        before.append(take(loader, k * G)[0])
        state = json.loads(json.dumps(loader.state_dict()))
    after = []
    for rank in range(2):
        loader = PackLoader(open_dataset(str(root), sizes[2], rank), num_workers=2)
        loader.load_state_dict(state)
        after.append([pack_key(p) for p in loader])
    per = G * v // 2
    resumed = [
        sorted(mb for rank in after for mb in rank[s : s + per])
        for s in range(0, len(after[0]), per)
    ]
    assert resumed == steps[k:]
    dataset = loader.plan_dataset
    left = full_plan(dataset.index, dataset.config, 0).plan.remainder
    check_every_record_once([*before, *after], 300, left_out=left)


def test_the_datamodule_runs_canonical_ranks_under_the_token_contract(mds_dir: Path) -> None:
    """``BCLDataModule(plan={"contract": "tokens", ...}, elastic={"canonical_ranks": 4})``:
    on 4 ranks (G_c = G) and on 2 ranks (accumulation 2G) every optimizer step holds the same
    collated micro-batches, each within T, the same count on every rank."""
    elastic = {"canonical_ranks": 4, "canonical_ranks_per_node": 2, "canonical_grad_accum": G}

    def steps(world: int) -> list[list[tuple[int, ...]]]:
        accum = G * 4 // world
        ranks = []
        for r in range(world):
            dm = module(mds_dir, elastic=elastic)
            dm.setup_for(r, world, 2, grad_accum=accum)
            ranks.append([pack_key(b) for b in dm.train_dataloader()])
            for b in dm.train_dataloader():
                assert b["input_ids"].numel() <= T
        assert len({len(rank) for rank in ranks}) == 1
        return [
            sorted(mb for rank in ranks for mb in rank[s : s + accum])
            for s in range(0, len(ranks[0]), accum)
        ]

    assert steps(2) == steps(4)
