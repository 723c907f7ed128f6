"""``contract="tokens"`` end to end through the DataModule's readers (MDS and WebDataset, every
scope, DataLoader workers, mid-epoch resume): no micro-batch over the budget, the same number of
micro-batches on every rank and a whole number of optimizer steps, every record of the epoch
yielded once or reported, the same micro-batches on every run, and a resume that replays the
uninterrupted run exactly (``planner/token_contract.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pack_oracles import check_every_record_once
from resume_harness import DataModuleLoader, pack_key, run_test_save_load_state
from two_term_reference import check_two_terms_refined

from bcl_stream.epoch.cursor import STATE_VERSION
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.errors import StateError
from bcl_stream.process_layout import ProcessLayout
from lightning_module.datamodule import BCLDataModule

pytestmark = pytest.mark.slow

T, G, W = 128, 2, 4


def module(
    root: Path, scope: str = "node", workers: int = 0, collate: str = "packed", **kwargs: Any
) -> BCLDataModule:
    plan = {"window": W, "scope": scope, "contract": "tokens", "max_tokens": T}
    loader = {"num_workers": workers}
    batch = {"collate": collate}
    return BCLDataModule(str(root), plan=plan, seed=2, loader=loader, batch=batch, **kwargs)


def setup(root: Path, rank: int, world: int, per_node: int, **kwargs: Any) -> BCLDataModule:
    dm = module(root, **kwargs)
    dm.setup_for(rank, world, per_node, grad_accum=G)
    return dm


LAYOUTS = [  # (format, scope, world, ranks per node)
    ("mds", "node", 2, 2),
    ("wds", "node", 2, 2),
    ("mds", "rank", 2, 2),
    ("wds", "rank", 2, 1),
    ("mds", "world", 2, 1),
    ("wds", "world", 4, 2),
]


IMAGE_LAYOUTS = [("mds", "node", 2, 2), ("wds", "rank", 4, 2), ("mds", "world", 4, 2)]
"""Image-text components under a two-term cost model (image tokens count toward T): the
readers refine each micro-batch's two terms within the budget."""
VLM = {"cost_model": "qwen2-vl-2b"}


@pytest.mark.parametrize(
    ("fmt", "scope", "world", "per_node", "images"),
    [(*case, False) for case in LAYOUTS] + [(*case, True) for case in IMAGE_LAYOUTS],
)
def test_budget_equal_counts_every_record_once(
    mds_dir: Path,
    wds_dir: Path,
    vlm_dirs: dict[str, Path],
    fmt: str,
    scope: str,
    world: int,
    per_node: int,
    images: bool,
) -> None:
    root = vlm_dirs[fmt] if images else mds_dir if fmt == "mds" else wds_dir
    kw: dict[str, Any] = {"format": fmt, "scope": scope, **(VLM if images else {})}
    modules = [setup(root, r, world, per_node, **kw) for r in range(world)]
    ranks = [list(dm.train_dataloader()) for dm in modules]
    counts = {len(rank) for rank in ranks}
    assert len(counts) == 1 and counts.pop() % G == 0  # equal counts, whole optimizer steps
    assert len(ranks[0]) > G
    for rank in ranks:
        for batch in rank:
            assert batch["sample_ids"].numel() >= 1
            assert batch["input_ids"].numel() <= T  # packed: one row of the records' tokens
    ids = [int(i) for rank in ranks for b in rank for i in b["sample_ids"]]
    dm = modules[0]
    plan = full_plan(dm.dataset.index, dm.dataset.config, 0)  # type: ignore[union-attr]
    check_every_record_once(ids, 300, plan.plan.remainder)
    left = dm.remainder_counts()
    assert (
        len(ids) + sum(left.values()) + plan.plan.remainder_counts().get("over_token_budget", 0)
        == 300
    )
    sizes = {int(b["sample_ids"].numel()) for rank in ranks for b in rank}
    assert len(sizes) > 1  # records per micro-batch vary
    again = list(setup(root, 0, world, per_node, **kw).train_dataloader())
    assert [pack_key(b) for b in again] == [pack_key(b) for b in ranks[0]]
    if images:
        check_two_terms_refined(dm.dataset.index, dm.dataset.config, plan.plan.packs, 0)  # type: ignore[union-attr]


@pytest.mark.parametrize(("fmt", "images"), [("mds", False), ("wds", False), ("wds", True)])
def test_mid_epoch_resume_and_workers_are_exact(
    mds_dir: Path, wds_dir: Path, vlm_dirs: dict[str, Path], fmt: str, images: bool
) -> None:
    root = vlm_dirs[fmt] if images else mds_dir if fmt == "mds" else wds_dir
    kw: dict[str, Any] = {"format": fmt, **(VLM if images else {})}
    full = list(setup(root, 1, 2, 2, **kw).train_dataloader())
    with_workers = list(setup(root, 1, 2, 2, workers=2, **kw).train_dataloader())
    assert [pack_key(b) for b in with_workers] == [pack_key(b) for b in full]
    run_test_save_load_state(
        lambda: DataModuleLoader(module(root, **kw), 1, 2, 2, grad_accum=G),
        epochs=1,
        positions=[1, G + 1, len(full) - 1],
        make_resumed=lambda: DataModuleLoader(module(root, workers=2, **kw), 1, 2, 2, grad_accum=G),
        reference=[[pack_key(b) for b in full]],
    )


def test_the_state_records_the_contract(mds_dir: Path) -> None:
    first = setup(mds_dir, 0, 1, 1)
    next(iter(first.train_dataloader()))
    state = first.state_dict()
    assert state["reader"]["version"] == STATE_VERSION  # 7 and later hold the tokens contract
    assert state["reader"]["config"]["plan"]["contract"] == "tokens"
    other = BCLDataModule(str(mds_dir), plan={"window": W}, seed=2, batch={"collate": "packed"})
    other.setup_for(0, 1, 1, grad_accum=G)
    with pytest.raises(StateError, match=r"contract|max_tokens|pack_size"):
        other.load_state_dict(state)
    old = {**state["reader"], "version": 6}
    same = setup(mds_dir, 0, 1, 1)
    with pytest.raises(StateError, match="version 6 says contract='tokens'"):
        same.load_state_dict({**state, "reader": old})


def test_plan_command_prints_the_micro_batches_the_reader_yields(
    mds_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bcl_stream.cli import main

    argv = ["plan", str(mds_dir), "--world-size", "2", "--contract", "tokens"]
    argv += ["--max-tokens", str(T), "--window", str(W), "--grad-accum", str(G), "--seed", "2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    read = [
        [b["sample_ids"].tolist() for b in setup(mds_dir, r, 2, 2).train_dataloader()]
        for r in range(2)
    ]
    assert [rank["packs"] for rank in out["ranks"]] == read  # no padding, the same records
    assert main(argv) == 0
    assert f"of at most {T} tokens (contract tokens)" in capsys.readouterr().out


def test_the_bcl_packs_stage_of_a_stock_webdataset_pipeline_follows_the_tokens_plan(
    wds_dir: Path,
) -> None:
    import webdataset as wds

    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.wds_reader import WDSPackDataset, bcl_packs

    config = ReaderConfig.build(
        world_size=2, window=W, grad_accum=G, contract="tokens", max_tokens=T, seed=8
    )
    dataset = WDSPackDataset(wds_dir, config, 1)
    urls = [str(wds_dir / shard.name) for shard in dataset.index.shards]
    stage = wds.pipelinefilter(bcl_packs)(index=dataset.index, config=config, rank=1)
    pipe = wds.DataPipeline(
        wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode(), stage
    )
    got = [[int(s["__key__"]) for s in pack] for pack in pipe]
    want = [[int(i) for i in row if i >= 0] for row in dataset.epoch_plan().rank_packs(1)]
    assert got == want and len({len(p) for p in got}) > 1


def test_a_mixture_under_the_tokens_contract_counts_each_stream_once(
    mds_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from bcl_stream.cli import main

    other = shutil.copytree(mds_dir, tmp_path / "copy")
    argv = ["plan", "--stream", f"{mds_dir}:proportion=0.5", "--stream", f"{other}:proportion=0.5"]
    argv += ["--world-size", "2", "--contract", "tokens", "--max-tokens", str(T)]
    argv += ["--window", str(W), "--grad-accum", str(G), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    used = [s["records_used"] for s in out["streams"]]
    assert sum(used) == out["records_used"] == sum(len(p) for r in out["ranks"] for p in r["packs"])
    for s in out["streams"]:
        assert s["records_used"] + sum(s["records_left"].values()) == s["records_drawn"]


@pytest.mark.parametrize(
    ("old", "new", "after", "per_node", "images"),
    [(2, 3, 3, 1, False), (3, 2, 0, 1, False), (2, 1, 5, 1, False), (4, 2, 3, 2, True)],
)
def test_elastic_resume_uses_every_record_once(
    mds_dir: Path,
    vlm_dirs: dict[str, Path],
    old: int,
    new: int,
    after: int,
    per_node: int,
    images: bool,
) -> None:
    """A state saved after ``after`` micro-batches on ``old`` ranks resumes on ``new``: the
    records of the old ranks' first micro-batches are consumed, the rest re-planned. With
    image components under a two-term model too: the refinement exchanges records only
    within a node at one micro-batch index, so the old ranks' first micro-batches hold the
    same records refined or not, and the new ranks' re-plan is refined as any plan."""
    from resume_harness import run_elastic_resume

    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    root = vlm_dirs["mds"] if images else mds_dir
    config = ReaderConfig.build(
        world_size=old,
        ranks_per_node=per_node,
        window=W,
        grad_accum=G,
        contract="tokens",
        max_tokens=T,
        seed=2,
        cost_model=VLM["cost_model"] if images else None,
    )
    resized = config.resized(ProcessLayout(world_size=new, ranks_per_node=per_node))
    run = run_elastic_resume(
        lambda c, rank: PackLoader(MDSPackDataset(root, c, rank)),
        config,
        resized,
        old,
        new,
        after,
    )
    assert len(run.lengths) == 1
    dataset = run.resumed[-1].plan_dataset
    left = full_plan(dataset.index, resized, 0, dataset.segments).plan.remainder
    check_every_record_once(run.ids, 300, left_out=left)


def test_fabric_save_load_resumes_the_token_micro_batches_exactly(
    mds_dir: Path, tmp_path: Path
) -> None:
    """Under Fabric (``tools/train_fabric.py``): micro-batches of at most T tokens, a save in
    mid-epoch and one past the epoch's end resume the uninterrupted run's micro-batches."""
    import torch
    from lightning_scripts.harness import pack_log, tiny_config
    from resume_harness import check_resumed_runs

    from tools import train_fabric

    plan = {"contract": "tokens", "max_tokens": T, "window": W}
    kwargs: dict[str, Any] = {"plan": plan, "batch": {"collate": "packed"}}
    plain = module(mds_dir)
    plain.setup_for(0, 1, 1, grad_accum=1)  # what the Fabric loop (no accumulation) plans
    per_epoch = len(plain.train_dataloader())
    total = per_epoch + 3

    def run(workdir: Path, **kw: Any) -> list[tuple[int, int, int, list[int]]]:
        train_fabric.train(
            str(mds_dir), workdir, steps=total, model_config=tiny_config(), **kwargs, **kw
        )
        log = pack_log(workdir)
        return [(x["step"], x["epoch"], x["batch_idx"], x["sample_ids"]) for x in log]

    saves = (3, per_epoch + 1)
    full = run(tmp_path / "full", save_at=saves)
    assert [e[1] for e in full] == [0] * per_epoch + [1] * 3
    epoch0 = [i for e in full if e[1] == 0 for i in e[3]]
    check_every_record_once(epoch0)

    def resume(step: int) -> list[tuple[int, int, int, list[int]]]:
        ckpt = tmp_path / "full" / "ckpt" / f"step={step}.ckpt"
        assert torch.load(ckpt, weights_only=False)["step"] == step
        return run(tmp_path / f"resumed{step}", resume=ckpt)

    check_resumed_runs(full, resume, saves)
