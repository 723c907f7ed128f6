"""The DataModule on SFT data: each batch's ``step_loss_tokens`` is the trained-token count of
its optimizer step (whatever the DataLoader workers), records longer than the model's limit are
truncated, planned as truncated and reported at set-up, and a partial mask past the cut makes
the model count the labels instead (no batch carries a count the plan cannot know)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sft_records import records, trained_positions, write_sft_mds

from bcl_stream.epoch.plan import costs_and_table
from lightning_module.datamodule import BCLDataModule
from tests.hf_models import tiny_llama_dir
from tests.trainers import cpu_trainer

RECS = records(60, seed=11)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sft_mds(tmp_path_factory.mktemp("sft") / "mds", RECS)


def batches(dm: BCLDataModule) -> list[dict]:  # type: ignore[type-arg]
    return list(dm.train_dataloader())


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_carries_its_steps_trained_tokens(sft_dir: Path, workers: int) -> None:
    dm = BCLDataModule(
        str(sft_dir), plan={"pack_size": 2, "window": 2}, batch={"collate": "packed", "labels": "unshifted"},
        loader={"num_workers": workers},
    )  # fmt: skip
    dm.setup_for(rank=0, world_size=1, ranks_per_node=1, grad_accum=3)
    assert dm.normalization == "plan"
    got = batches(dm)
    assert len(got) == 30
    for k in range(0, len(got), 3):
        step = got[k : k + 3]
        want = sum(trained_positions(RECS[i]).size for b in step for i in b["sample_ids"].tolist())
        assert sum(int(b["loss_tokens"]) for b in step) == want
        assert {int(b["step_loss_tokens"]) for b in step} == {want}


def test_the_models_limit_truncates_plans_and_is_reported(
    sft_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dm = BCLDataModule(
        str(sft_dir),
        plan={"pack_size": 2, "window": 2},
        batch={"collate": "packed", "labels": "unshifted", "max_seq_len": 30},
    )
    dm.model_max_seq_len(SimpleNamespace(max_seq_len=20))  # what HFCausalLM states
    dm.setup_for(rank=0, world_size=1, ranks_per_node=1, grad_accum=2)
    long = [i for i, r in enumerate(RECS) if r["input_ids"].size > 20]
    cut = sum(RECS[i]["input_ids"].size - 20 for i in long)
    assert dm.dataset is not None and dm.dataset.config.max_seq_len == 20
    costs, _ = costs_and_table(dm.dataset.index, dm.dataset.config)
    assert np.asarray(costs).tolist() == [min(r["input_ids"].size, 20) for r in RECS]
    with caplog.at_level(logging.INFO):
        got = batches(dm)
    line = " ".join(r.getMessage() for r in caplog.records if "BCLDataModule" in r.getMessage())
    assert f"max_seq_len=20: {len(long)} records longer are truncated ({cut} tokens cut)" in line
    # partial masks past the cut: the index cannot give their count, the model rescales
    assert dm.normalization == "rescale" and "gradients rescaled" in line
    assert all("step_loss_tokens" not in b and "rank_step_loss_tokens" not in b for b in got)
    for b in got:
        assert int(b["tokens"].max()) <= 20
        want = sum(trained_positions(RECS[i], 20).size for i in b["sample_ids"].tolist())
        assert int(b["loss_tokens"]) == want


def test_max_seq_len_that_cuts_nothing_leaves_the_plan_and_cursor_as_they_were(
    sft_dir: Path,
) -> None:
    batch = {"collate": "packed", "max_seq_len": 4096}
    dm = BCLDataModule(str(sft_dir), plan={"pack_size": 2, "window": 2}, batch=batch)
    dm.setup_for(rank=0, world_size=1, ranks_per_node=1)
    assert dm.dataset is not None and dm.dataset.config.max_seq_len is None
    assert "max_seq_len" not in dm.train_dataloader().state_dict()["config"]


def test_a_trainer_fit_feeds_hf_causal_lm_at_most_its_stated_limit(
    sft_dir: Path, tmp_path: Path
) -> None:
    import lightning.pytorch as pl
    import torch

    from lightning_module.hf_causal_lm import HFCausalLM

    tiny_llama_dir(tmp_path / "model", max_position_embeddings=24, width=16, layers=1)
    model = HFCausalLM(str(tmp_path / "model"), attention="sdpa")
    dm = BCLDataModule(
        str(sft_dir), plan={"pack_size": 2, "window": 2}, batch={"collate": "packed", "labels": "unshifted"},
        eval={"val_data": str(sft_dir)},
    )  # fmt: skip
    seen: list[int] = []

    class Longest(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, i) -> None:  # type: ignore[no-untyped-def]
            seen.append(int(batch["tokens"].max()))

    trainer = cpu_trainer(
        max_steps=6, callbacks=[Longest()], default_root_dir=str(tmp_path), limit_val_batches=3,
        val_check_interval=6,
    )  # fmt: skip
    trainer.fit(model, dm)
    assert model.labels == "unshifted"  # the DataModule's batch.labels, taken at setup
    assert torch.isfinite(trainer.callback_metrics["val_loss"])
    assert dm.fed_max_seq_len == 24
    assert dm.dataset is not None and dm.dataset.config.max_seq_len == 24
    assert len(seen) == 6 and max(seen) <= 24


@pytest.mark.parametrize("given", [None, "shifted", "unshifted"])
def test_hf_causal_lm_follows_or_refuses_the_datamodule_label_convention(
    sft_dir: Path, tmp_path: Path, given: str | None
) -> None:
    """The DataModule's default, shifted labels, must reach the model: a model that took them
    for unshifted would shift them again and train every record to predict two tokens ahead."""
    from lightning_module.hf_causal_lm import HFCausalLM

    tiny_llama_dir(tmp_path / "model", max_position_embeddings=64, width=16, layers=1)
    model = HFCausalLM(str(tmp_path / "model"), attention="sdpa", labels=given)
    dm = BCLDataModule(str(sft_dir), plan={"pack_size": 2, "window": 2})  # labels: shifted
    trainer = cpu_trainer(max_steps=1, default_root_dir=str(tmp_path))
    if given == "unshifted":
        with pytest.raises(
            ValueError, match="labels='unshifted' contradicts the DataModule's labels='shifted'"
        ):
            trainer.fit(model, dm)
        return
    trainer.fit(model, dm)
    assert model.labels == "shifted"


def test_under_the_step_contract_each_rank_counts_the_records_it_was_dealt(
    tmp_path: Path,
) -> None:
    """2 nodes x 2 ranks, padded, contract step: the re-cut deals each step's records among a
    node's ranks, so a rank's share (``rank_step_loss_tokens``) is what it received."""
    recs = records(120, seed=5)
    root = write_sft_mds(tmp_path / "mds", recs)
    for rank in range(4):
        dm = BCLDataModule(
            str(root), plan={"pack_size": 2, "window": 2, "scope": "node", "contract": "step"},
            batch={"collate": "padded"},
        )  # fmt: skip
        dm.setup_for(rank=rank, world_size=4, ranks_per_node=2, grad_accum=2)
        assert dm.normalization == "all_reduce"
        got = batches(dm)
        assert got
        for k in range(0, len(got), 2):
            step = got[k : k + 2]
            own = sum(trained_positions(recs[i]).size for b in step for i in b["sample_ids"])
            assert sum(int(b["loss_tokens"]) for b in step) == own
            assert {int(b["rank_step_loss_tokens"]) for b in step} == {own}


def test_a_fit_trains_the_hf_model_in_training_mode_with_checkpointing_and_dropout(
    sft_dir: Path, tmp_path: Path
) -> None:
    """A model with weights (``from_pretrained``, which returns it in eval mode) is trained in
    training mode on every batch of a real fit: under gradient checkpointing each decoder layer
    runs twice per step (forward, then the recompute in backward), and attention dropout makes
    two forwards of one batch differ while an eval-mode forward is deterministic."""
    import lightning.pytorch as pl
    import torch

    from lightning_module.hf_causal_lm import HFCausalLM

    directory = tiny_llama_dir(
        tmp_path / "model", max_position_embeddings=64, width=16, layers=2, attention_dropout=0.5
    )
    HFCausalLM(str(directory), attention="sdpa").model.save_pretrained(directory)
    model = HFCausalLM(str(directory), attention="sdpa", gradient_checkpointing=True)
    layers = list(model.model.model.layers)
    calls = [0] * len(layers)
    for k, layer in enumerate(layers):
        layer.register_forward_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
    seen: list[dict] = []  # type: ignore[type-arg]

    class Watch(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, i) -> None:  # type: ignore[no-untyped-def]
            self.start = list(calls)
            seen.append({"modes": {m.training for m in module.modules()}})

        def on_before_optimizer_step(self, trainer, module, optimizer) -> None:  # type: ignore[no-untyped-def]
            # the recomputed layers pass gradients back (not None: checkpointed inputs need grad)
            seen[-1]["grads"] = {p.grad is not None for p in module.parameters()}

        def on_train_batch_end(self, trainer, module, outputs, batch, i) -> None:  # type: ignore[no-untyped-def]
            row = seen[-1]
            row["calls"] = [b - a for a, b in zip(self.start, calls, strict=True)]
            with torch.no_grad():
                row["dropout_varies"] = not torch.equal(module(batch), module(batch))
                module.eval()
                row["eval_same"] = torch.equal(module(batch), module(batch))
                module.train()

    dm = BCLDataModule(str(sft_dir), plan={"pack_size": 2, "window": 2})
    trainer = cpu_trainer(max_steps=3, callbacks=[Watch()], default_root_dir=str(tmp_path))
    trainer.fit(model, dm)
    assert len(seen) == 3
    for row in seen:
        assert row["modes"] == {True}  # every module, the HF model's included
        assert row["calls"] == [2] * len(layers)  # forward + recompute
        assert row["grads"] == {True}
        assert row["dropout_varies"] and row["eval_same"]
