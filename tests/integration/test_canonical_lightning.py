"""Canonical ranks through Lightning: 2 DDP ranks (gloo, CPU) interrupted after an optimizer
step and resumed on 1 rank with the accumulation doubled train the very steps of the
uninterrupted 2-rank run, and the weights after the epoch equal it within float tolerance.

Each run is a ``python -m lightning_module fit`` process (configs/cpu_demo.yaml, the tiny
model); under pytest, strategy ``ddp`` would re-run pytest in the child.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning_scripts.harness import cli_fit, cli_run_config, make_trainer, tiny_config
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_log

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.io.index import read_index
from bcl_stream.loading.loader import PackLoader
from lightning_module.callbacks import read_pack_log
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

PACK, WINDOW, G_C, V, STOP = 8, 4, 2, 2, 3
DATA: dict[str, Any] = {
    "seed": 5, "plan": {"pack_size": PACK, "window": WINDOW, "scope": "node"},
    "loader": {"num_workers": 1},
    "elastic": {"canonical_ranks": V, "canonical_ranks_per_node": V, "canonical_grad_accum": G_C},
}  # fmt: skip


def steps(tmp: Path, name: str, ranks: int) -> dict[int, list[list[int]]]:
    """Optimizer step -> its packs (sorted), every rank's micro-batches together."""
    out: dict[int, list[list[int]]] = defaultdict(list)
    for r in range(ranks):
        for line in read_pack_log(tmp / name / "logs" / f"packs_rank{r}.jsonl"):
            out[line["step"]].append(line["sample_ids"])
    return {s: sorted(packs) for s, packs in out.items()}


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def test_two_ranks_resumed_on_one_train_the_same_steps(mds_dir: Path, tmp_path: Path) -> None:
    full_cfg = cli_run_config(
        ROOT / "configs" / "cpu_demo.yaml", tmp_path, "full", STOP, {"data": str(mds_dir), **DATA}
    )
    cli_fit(ROOT, full_cfg, "--trainer.accumulate_grad_batches", str(G_C * V // 2))
    full = steps(tmp_path, "full", 2)
    # The oracle is the plain plan for V ranks: step s holds its packs s*G_c .. s*G_c+G_c-1.
    plain = ReaderConfig.build(
        world_size=V, ranks_per_node=V, pack_size=PACK, window=WINDOW, seed=5, scope="node",
        layout="packed", grad_accum=G_C,
    )  # fmt: skip
    packs = full_plan(read_index(mds_dir), plain, 0).plan.packs
    n_steps = -(-packs.shape[1] // G_C)
    want = {
        s: sorted(packs[:, s * G_C : s * G_C + G_C].reshape(-1, PACK).tolist())
        for s in range(n_steps)
    }
    assert full == want and n_steps > STOP + 2

    ckpt = tmp_path / "full" / "ckpt" / f"step={STOP}.ckpt"
    resumed_cfg = cli_run_config(
        ROOT / "configs" / "cpu_demo.yaml", tmp_path, "one", STOP, {"data": str(mds_dir), **DATA}
    )
    cli_fit(
        ROOT, resumed_cfg, "--trainer.devices", "1", "--trainer.strategy", "auto",
        "--trainer.accumulate_grad_batches", str(G_C * V), "--ckpt_path", str(ckpt),
    )  # fmt: skip
    one = steps(tmp_path, "one", 1)
    check_resumed_log(sorted(full.items()), STOP, sorted(one.items()))
    a, b = (
        weights(tmp_path / "full" / "ckpt" / "last.ckpt"),
        weights(tmp_path / "one" / "ckpt" / "last.ckpt"),
    )
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-5), key
    assert not all(torch.equal(a[k], weights(ckpt)[k]) for k in a)  # the tail trained


def module(mds_dir: Path, workers: int = 0, **elastic: Any) -> BCLDataModule:
    """The DataModule of DATA with ``workers`` DataLoader workers and ``elastic`` changed."""
    return BCLDataModule(
        str(mds_dir),
        **{**DATA, "loader": {"num_workers": workers}, "elastic": {**DATA["elastic"], **elastic}},
        batch={"collate": "packed", "max_seq_len": 1024},
    )


def test_accumulation_mismatch_is_refused_in_one_line(mds_dir: Path, tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2)
    with pytest.raises(
        ValueError, match=r"^accumulate_grad_batches=2 but.*set accumulate_grad_batches=4 "
    ):
        trainer.fit(TinyGPT(tiny_config()), module(mds_dir))


def test_datamodule_steps_equal_at_every_size(mds_dir: Path) -> None:
    """Through the DataModule (setup_for each physical layout; 0 and 2 workers): the packs of
    every optimizer step are the same at R = 4, 2, 1 for canonical_ranks=4."""
    by_size = {}
    for r, workers in ((4, 0), (2, 2), (1, 0)):
        per_rank = []
        for rank in range(r):
            dm = module(mds_dir, workers, canonical_ranks=4, canonical_ranks_per_node=2)
            dm.setup_for(rank, r, min(r, 2), grad_accum=G_C * 4 // r)
            loader = PackLoader(dm._require_dataset(), num_workers=workers)
            per_rank.append([[x["sample_id"] for x in p] for p in loader])
        per = G_C * 4 // r
        n = len(per_rank[0])
        assert all(len(x) == n for x in per_rank)
        by_size[r] = [
            sorted(p for rank in per_rank for p in rank[s : s + per]) for s in range(0, n, per)
        ]
        check_every_record_once(per_rank, what=f"{r} ranks")
    assert by_size[4] == by_size[2] == by_size[1] and len(by_size[1]) > 2
    assert np.all([len(s) == 4 * G_C for s in by_size[1][:-1]])


def batch_key(batch: dict[str, Any]) -> tuple[int, ...]:
    """A collated batch by its token ids (the DataModule's loader yields tensors)."""
    return tuple(batch["input_ids"].flatten().tolist())


def test_the_datamodule_reads_through_the_reader_a_resume_adopted(mds_dir: Path) -> None:
    """canonical_ranks_per_node unpinned: the cursor records the physical node size (2) and a
    resume adopts it, which swaps the loader's reader. With persistent workers alive from an
    earlier pass, a resume through the DataModule's ``load_state_dict`` yields the rest of the
    uninterrupted run; one through the loader's own (a Fabric script that saves the loader)
    leaves the DataModule reporting on the loader's reader, not on the one ``setup`` opened
    (whose cursor the loader no longer moves)."""

    def make(rank: int) -> BCLDataModule:
        dm = BCLDataModule(
            str(mds_dir),
            **{
                **DATA,
                "loader": {"num_workers": 1, "persistent_workers": True},
                "elastic": {"canonical_ranks": V, "canonical_grad_accum": G_C},
            },
            batch={"collate": "packed", "max_seq_len": 1024},
        )
        dm.setup_for(rank, V, V, grad_accum=G_C)
        return dm

    for rank in range(V):
        whole = [batch_key(b) for b in make(rank).train_dataloader()]
        k = len(whole) // 3
        first = make(rank)
        before = [batch_key(b) for _, b in zip(range(k), first.train_dataloader(), strict=False)]
        state = first.state_dict()
        assert state["reader"]["config"]["canonical_ranks_per_node"] == V
        resumed = make(rank)
        loader = resumed.train_dataloader()
        assert [batch_key(b) for b in loader] == whole  # the workers are alive
        resumed.load_state_dict(state)
        assert resumed.dataset is loader.plan_dataset
        assert before + [batch_key(b) for b in loader] == whole

        fabric = make(rank)
        loader = fabric.train_dataloader()
        loader.load_state_dict(state["reader"])
        assert fabric.dataset is loader.plan_dataset
        assert loader.plan_dataset.config.canonical_ranks_per_node == V
        assert [batch_key(b) for b in loader] == whole[k:]
        assert fabric.remainder_counts() == loader.plan_dataset.remainder_counts()
