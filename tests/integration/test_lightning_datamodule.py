"""BCLDataModule behaviour under Lightning: bug #20550, what an epoch holds (checked against\nexpectations computed by hand, not by the planner), state checks.

Lightning bug #20550: when ``configure_optimizers`` reads ``trainer.estimated_stepping_batches``
and ``max_epochs`` is set, the loader state saved in the checkpoint is silently not restored.
The DataModule carries the same cursor and hands it to the loader; the control case strips the
DataModule's state from the checkpoint and shows the resumed run would then repeat packs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning_scripts.harness import make_trainer, pack_log, packs_by_step, tiny_config
from pack_oracles import balance_efficiency, check_epoch, check_every_record_once, write_order_packs
from resume_harness import check_resumed_runs

from bcl_stream.errors import StateError
from bcl_stream.io.index import read_index
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

pytestmark = pytest.mark.slow


class ScheduledGPT(TinyGPT):
    """Reads ``estimated_stepping_batches`` in ``configure_optimizers`` (triggers #20550)."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=int(total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def dm(root: Path, plan: dict[str, Any] | None = None, **kwargs: Any) -> BCLDataModule:
    """B=8, W=4, seed 1; ``plan`` changes planner knobs, ``kwargs`` other arguments."""
    knobs = {"pack_size": 8, "window": 4, **(plan or {})}
    return BCLDataModule(str(root), plan=knobs, **{"seed": 1, **kwargs})


def fit(workdir: Path, module: BCLDataModule, ckpt: Path | None = None, **kw: Any) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(workdir, max_epochs=2, **kw)
    trainer.fit(ScheduledGPT(tiny_config()), module, ckpt_path=ckpt)


def test_estimated_stepping_batches_with_max_epochs_resumes_exactly(
    mds_dir: Path, tmp_path: Path
) -> None:
    full = tmp_path / "full"
    fit(full, dm(mds_dir), save_at=(10,))
    log = pack_log(full)
    ckpt = full / "ckpt" / "step=10.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    assert saved["BCLDataModule"]["reader"]["packs_consumed"] == 10

    def resume(step: int) -> list[tuple[int, int, list[int]]]:
        fit(tmp_path / "resumed", dm(mds_dir), ckpt=full / "ckpt" / f"step={step}.ckpt")
        return packs_by_step(pack_log(tmp_path / "resumed"))

    check_resumed_runs(packs_by_step(log), resume, [10])

    # Control: without the DataModule's copy of the cursor, the bug restarts the epoch.
    del saved["BCLDataModule"]
    stripped = tmp_path / "stripped.ckpt"
    torch.save(saved, stripped)
    control = tmp_path / "control"
    fit(control, dm(mds_dir), ckpt=stripped)
    first = pack_log(control)[0]["sample_ids"]
    assert first == log[0]["sample_ids"] != log[10]["sample_ids"], (
        "Lightning restored the loader state by itself: #20550 may be fixed in this version"
    )


def epoch_packs(root: Path, ranks: int = 2, epochs: int = 1, **kwargs: Any) -> list[Any]:
    """packs[epoch][rank][t]: every rank's sample ids for ``epochs`` passes over its loader,
    each rank in its own DataModule (one node of ``ranks`` ranks)."""
    by_rank = []
    for rank in range(ranks):
        module = dm(root, **kwargs)
        module.setup_for(rank, ranks, ranks)
        loader = module.train_dataloader()
        by_rank.append([[b["sample_ids"].tolist() for b in loader] for _ in range(epochs)])
    return [[by_rank[r][e] for r in range(ranks)] for e in range(epochs)]


def test_sequential_packing_in_write_order_is_consecutive_slices(mds_dir: Path) -> None:
    """Unshuffled, the node's stream is the write order: each rank's packs are consecutive
    B-record slices of its share of every chunk of W packs per rank (computed by hand)."""
    (got,) = epoch_packs(mds_dir, packing="sequential", plan={"shuffle": False})
    want, tail = write_order_packs(300, ranks=2, pack_size=8, window=4)
    assert got == want
    module = dm(mds_dir, packing="sequential", plan={"shuffle": False})
    module.setup_for(1, 2, 2)
    assert module.remainder_counts() == {"epoch_tail": tail} == {"epoch_tail": 12}


@pytest.mark.parametrize("packing", ["bcl", "sequential"])
def test_packs_are_exact_disjoint_and_a_function_of_seed_and_epoch(
    mds_dir: Path, packing: str
) -> None:
    first, second = epoch_packs(mds_dir, epochs=2, packing=packing)
    for packs in (first, second):
        check_epoch(packs, 300, pack_size=8, left_out=300 % (2 * 8))
    assert first != second, "epoch 1 repeated epoch 0's order"
    assert epoch_packs(mds_dir, epochs=2, packing=packing) == [first, second]
    assert epoch_packs(mds_dir, packing=packing, seed=2)[0] != first
    assert first != write_order_packs(300, ranks=2, pack_size=8, window=4)[0]  # shuffled


@pytest.mark.parametrize("scope", ["node", "rank"])
def test_bcl_packs_balance_better_than_sequential(scope: str, mds_dir: Path) -> None:
    # Summed record costs are what the packed layout balances (padded: B x the longest record,
    # where scope node packs records of neighbouring length and the sum is not its aim).
    costs = np.asarray(read_index(mds_dir).costs())
    plan, batch = {"scope": scope}, {"collate": "packed"}
    bcl = balance_efficiency(epoch_packs(mds_dir, plan=plan, batch=batch)[0], costs)
    sequential = balance_efficiency(
        epoch_packs(mds_dir, packing="sequential", plan=plan, batch=batch)[0], costs
    )
    # Measured here: node 1.000, rank 0.955, against 0.888 (300 tiny records, 2 ranks, B=8, W=4).
    assert bcl > sequential + 0.03, (bcl, sequential)


def test_est_cost_is_the_pack_cost(mds_dir: Path) -> None:
    module = dm(mds_dir, batch={"collate": "packed"})
    module.setup_for(0, 1, 1)
    costs = read_index(mds_dir).costs()
    for batch in module.train_dataloader():
        ids = batch["sample_ids"].numpy()
        assert float(batch["est_cost"]) == pytest.approx(float(costs[ids].sum()))
        assert int(batch["tokens"].sum()) == int(batch["cu_seqlens"][-1])


def test_state_round_trip_and_refusals(mds_dir: Path, wds_dir: Path) -> None:
    first = dm(mds_dir)
    first.setup_for(0, 1, 1)
    loader = first.train_dataloader()
    it = iter(loader)
    seen = [next(it)["sample_ids"].tolist() for _ in range(3)]
    state = first.state_dict()
    assert state["packing"] == "bcl" and state["reader"]["packs_consumed"] == 3

    second = dm(mds_dir)
    with pytest.raises(RuntimeError, match="before setup"):  # no copy kept for later
        second.load_state_dict(state)
    second.setup_for(0, 1, 1)
    second.load_state_dict(state)
    assert second.state_dict() == state
    rest = [b["sample_ids"].tolist() for b in second.train_dataloader()]
    full = [b["sample_ids"].tolist() for b in dm_loader(mds_dir)]
    assert seen + rest == full

    with pytest.raises(StateError, match="packing='bcl'"):
        dm(mds_dir, packing="sequential").load_state_dict(state)
    other = dm(wds_dir, format="wds")
    other.setup_for(0, 1, 1)
    other.train_dataloader()
    with pytest.raises(StateError, match="other data"):
        other.load_state_dict(state)
    changed = dm(mds_dir, plan={"pack_size": 4})
    changed.setup_for(0, 1, 1)
    changed.train_dataloader()
    with pytest.raises(StateError, match="pack_size=8"):
        changed.load_state_dict(state)


def test_the_loader_owns_the_cursor(mds_dir: Path) -> None:
    """A cursor loaded after setup goes straight into the loader; the DataModule's state is
    the loader's (no second copy that could disagree)."""
    first = dm(mds_dir)
    first.setup_for(0, 1, 1)
    loader = first.train_dataloader()
    n_packs = len(loader)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    assert state["reader"] == loader.state_dict()

    second = dm(mds_dir)
    second.setup_for(0, 1, 1)
    second.load_state_dict(state)
    assert second.state_dict() == state
    resumed = second.train_dataloader()
    assert resumed.state_dict() == state["reader"]
    assert len(list(resumed)) == n_packs - 2
    # After the epoch's last pack the saved cursor is in the next epoch.
    assert second.state_dict()["reader"] == resumed.state_dict()
    assert resumed.state_dict()["epoch"] == 1


def dm_loader(root: Path) -> Any:
    module = dm(root)
    module.setup_for(0, 1, 1)
    return module.train_dataloader()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "parquet"}, "format must be"),
        ({"packing": "random"}, "packing must be"),
        ({"batch": {"collate": "ragged"}}, "layout must be"),
        ({"loader": {"num_workers": 0, "persistent_workers": True}}, "persistent_workers"),
        ({"cost_model": "gpt-17"}, "unknown cost model"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BCLDataModule("unused", **kwargs)


@pytest.mark.parametrize("packing", ["bcl", "sequential"])
def test_remainder_is_reported(mds_dir: Path, packing: str) -> None:
    module = dm(mds_dir, plan={"pack_size": 1, "max_tokens": 50}, packing=packing)
    module.setup_for(0, 1, 1)
    tokens = read_index(mds_dir).tokens
    counts = module.remainder_counts()
    assert counts["longer_than_max_tokens"] == int(np.sum(tokens > 50)) > 0
    used = [int(i) for b in module.train_dataloader() for i in b["sample_ids"]]
    assert len(used) + sum(counts.values()) == 300
    check_every_record_once(used)
    assert max(int(tokens[i]) for i in used) <= 50


def test_s3_dataset_under_trainer(moto_s3: Any, tmp_path: Path) -> None:
    """``s3://`` data (loopback moto server): the Trainer sees every record once, in packs of
    exactly 4, and the shards came through the cache."""
    from tests.conftest import write_mds

    remote = moto_s3("bcl-lightning") + "/train"
    write_mds(remote, 120)
    plan = {"pack_size": 4, "window": 3}
    module = BCLDataModule(remote, plan=plan, cache_dir=str(tmp_path / "cache"))
    trainer = make_trainer(tmp_path, max_epochs=1)
    trainer.fit(TinyGPT(tiny_config()), module)
    trained = [x["sample_ids"] for x in pack_log(tmp_path)]
    check_epoch([trained], 120, pack_size=4, left_out=0)
    assert sum(module.remainder_counts().values()) == 0
    assert any((tmp_path / "cache").glob("shard.*.mds"))  # shards came from S3


def test_pack_log_refuses_batches_without_sample_ids(tmp_path: Path) -> None:
    from lightning_module.callbacks import PackLogWriter, read_pack_log

    writer = PackLogWriter(tmp_path, rank=3, fresh=True)
    kw = {"step": 0, "epoch": 0, "batch_idx": 0, "step_seconds": 0.1, "forward_seconds": 0.05}
    with pytest.raises(TypeError, match="sample_ids"):
        writer.write(batch={"input_ids": torch.zeros(2, 3)}, **kw)
    writer.write(batch={"sample_ids": torch.tensor([4, 2]), "tokens": torch.tensor([3, 5])}, **kw)
    writer.close()
    (line,) = read_pack_log(tmp_path / "packs_rank3.jsonl")
    assert line["sample_ids"] == [4, 2] and line["tokens"] == 8 and line["rank"] == 3
    assert line["est_cost"] is None
