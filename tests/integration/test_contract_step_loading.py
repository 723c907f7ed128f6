"""``contract="step"`` end to end: through the DataModule (MDS and WebDataset, workers, resume
in mid-step) and through 2-rank DDP (gloo) with gradient accumulation under LightningCLI.

Invariants under both contracts: every rank yields the same number of micro-batches; every
record of the epoch is yielded once or reported; resume replays exactly. Under ``step`` each
rank's optimizer step holds exactly G*B records (the plan's G packs), micro-batch sizes vary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lightning_scripts.harness import cli_fit, cli_run_config
from pack_oracles import check_every_record_once
from resume_harness import DataModuleLoader, pack_key, run_test_save_load_state

from bcl_stream.errors import StateError
from lightning_module.callbacks import read_pack_log
from lightning_module.datamodule import BCLDataModule

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

B, G, W = 4, 3, 4


def module(
    root: Path, contract: str, scope: str = "node", workers: int = 0, **kwargs: Any
) -> BCLDataModule:
    """Padded batches of B records under ``contract`` (set up with ``grad_accum=G``)."""
    plan = {"pack_size": B, "window": W, "scope": scope, "contract": contract}
    loader = {"num_workers": workers}
    return BCLDataModule(
        str(root), plan=plan, seed=2, batch={"collate": "padded"}, loader=loader, **kwargs
    )


def epoch(root: Path, contract: str, rank: int, **kwargs: Any) -> list[dict[str, Any]]:
    dm = module(root, contract, **kwargs)
    dm.setup_for(rank, 2, 2, grad_accum=G)
    return list(dm.train_dataloader())


@pytest.mark.parametrize(("fmt", "scope"), [("mds", "node"), ("wds", "node"), ("wds", "rank")])
@pytest.mark.parametrize("contract", ["pack", "step"])
def test_every_record_once_equal_counts_and_whole_steps(
    mds_dir: Path, wds_dir: Path, fmt: str, scope: str, contract: str
) -> None:
    root = mds_dir if fmt == "mds" else wds_dir
    ranks = [epoch(root, contract, r, format=fmt, scope=scope) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) > G  # equal micro-batch counts: no hang
    ids = [int(i) for rank in ranks for b in rank for i in b["sample_ids"]]
    check_every_record_once(ids)
    dm = module(root, contract, format=fmt, scope=scope)
    dm.setup_for(0, 2, 2, grad_accum=G)
    assert len(ids) + sum(dm.remainder_counts().values()) == 300
    sizes = [[int(b["sample_ids"].numel()) for b in rank] for rank in ranks]
    if contract == "pack":
        assert {s for rank in sizes for s in rank} == {B}
        assert all("loss_scale" not in b for b in ranks[0])
        return
    assert len({s for rank in sizes for s in rank}) > 1  # sizes vary
    plans = []
    for r in range(2):
        plan = module(root, contract, format=fmt, scope=scope)
        plan.setup_for(r, 2, 2, grad_accum=G)
        plans.append(plan.dataset.rank_packs())  # type: ignore[union-attr]
    for k in range(0, len(ranks[0]), G):
        steps = [[int(i) for b in rank[k : k + G] for i in b["sample_ids"]] for rank in ranks]
        assert [len(s) for s in steps] == [plans[0][k : k + G].size] * 2  # G*B per rank
        want = [p[k : k + G] for p in plans]  # the plan's records of the step
        check_every_record_once(steps, want, what=f"step {k // G}")
        if scope == "rank":  # each rank keeps its own; node: dealt among the node's ranks
            check_every_record_once(steps[0], plans[0][k : k + G], what=f"step {k // G}, rank 0")
    for r, rank in enumerate(ranks):
        scale = [float(b["loss_scale"]) for b in rank]
        assert scale == pytest.approx([s / B for s in sizes[r]])
        # Padded micro-batches hold records of similar length: the longest run alone or few.
        widths = [int(b["input_ids"].shape[1]) for b in rank]
        assert np.corrcoef(widths, sizes[r])[0, 1] < 0


@pytest.mark.parametrize("stop", [G + 1, 2 * G])
def test_resume_in_mid_step_and_with_workers_is_exact(mds_dir: Path, stop: int) -> None:
    full = epoch(mds_dir, "step", 1)
    with_workers = epoch(mds_dir, "step", 1, workers=2)
    assert [b["sample_ids"].tolist() for b in with_workers] == [
        b["sample_ids"].tolist() for b in full
    ]
    first = module(mds_dir, "step")
    first.setup_for(1, 2, 2, grad_accum=G)
    it = iter(first.train_dataloader())
    for _ in range(stop):
        next(it)
    assert first.state_dict()["reader"]["packs_consumed"] == stop
    run_test_save_load_state(
        lambda: DataModuleLoader(module(mds_dir, "step"), 1, 2, 2, grad_accum=G),
        epochs=1,
        positions=[stop],
        make_resumed=lambda: DataModuleLoader(
            module(mds_dir, "step", workers=2), 1, 2, 2, grad_accum=G
        ),
        reference=[[pack_key(b) for b in full]],
    )


def test_a_changed_contract_is_refused_on_resume(mds_dir: Path) -> None:
    first = module(mds_dir, "step")
    first.setup_for(0, 1, 1, grad_accum=G)
    next(iter(first.train_dataloader()))
    other = module(mds_dir, "pack")
    other.setup_for(0, 1, 1, grad_accum=G)
    with pytest.raises(StateError, match=r"contract|layout"):  # step plans for the layout
        other.load_state_dict(first.state_dict())


def test_ddp_two_ranks_with_accumulation_under_both_contracts(
    mds_dir: Path, tmp_path: Path
) -> None:
    """LightningCLI, 2 gloo ranks, accumulate_grad_batches=G: every rank runs the same steps
    of G*B records; a mid-epoch checkpoint (after 2 optimizer steps) resumed in a new process
    replays exactly the uninterrupted run's micro-batches on both ranks."""
    stop = 2 * G
    for contract in ("pack", "step"):
        plan = {"pack_size": B, "window": W, "scope": "node", "contract": contract}
        data = {"data": str(mds_dir), "seed": 2, "plan": plan, "batch": {"collate": "padded"}}
        full = cli_run_config(ROOT / "configs" / "cpu_demo.yaml", tmp_path, contract, 2, data)
        cli_fit(ROOT, full, "--trainer.accumulate_grad_batches", str(G))
        logs = [
            read_pack_log(tmp_path / contract / "logs" / f"packs_rank{r}.jsonl") for r in (0, 1)
        ]
        assert len(logs[0]) == len(logs[1]) > stop
        check_every_record_once([x["sample_ids"] for rank in logs for x in rank])
        steps = [[x["step"] for x in rank] for rank in logs]
        assert steps[0] == steps[1] == [k // G for k in range(len(logs[0]))]
        for rank in logs:
            sizes = [len(x["sample_ids"]) for x in rank]
            whole = len(sizes) - len(sizes) % G
            assert all(sum(sizes[k : k + G]) == G * B for k in range(0, whole, G))
            assert (set(sizes) == {B}) == (contract == "pack")
        if contract == "pack":  # resume under pack: tests/integration/test_ddp_lightning.py
            continue
        ckpt = tmp_path / contract / "ckpt" / "step=2.ckpt"
        resumed = cli_run_config(
            ROOT / "configs" / "cpu_demo.yaml", tmp_path, contract + "_r", 2, data
        )
        cli_fit(
            ROOT, resumed, "--trainer.accumulate_grad_batches", str(G), "--ckpt_path", str(ckpt)
        )
        again = [
            read_pack_log(tmp_path / (contract + "_r") / "logs" / f"packs_rank{r}.jsonl")
            for r in (0, 1)
        ]
        for r in (0, 1):
            want = [(x["step"], x["sample_ids"]) for x in logs[r][stop:]]
            assert [(x["step"], x["sample_ids"]) for x in again[r]] == want
