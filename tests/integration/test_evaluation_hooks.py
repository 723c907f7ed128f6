"""Validation and test hooks exist only where there is data to evaluate.

Lightning's evaluation loop flattened the empty list the hooks once returned into one "loader"
of length zero and warned "Total length of `list` across ranks is zero" on every run without
validation data (the demo's case). A demo-like fit (TinyGPT of configs/cpu_demo.yaml, a
trainer that validates) must print no such warning and run no validation step; with
validation data the loop runs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EMPTY = "across ranks is zero"


def demo_model(calls: list[str]) -> Any:
    """The demo's TinyGPT (its YAML model section), counting validation steps in ``calls``."""
    from lightning_module.tinygpt import TinyGPT, TinyGPTConfig

    section = yaml.safe_load((ROOT / "configs" / "cpu_demo.yaml").read_text())["model"]
    assert section["class_path"] == "lightning_module.tinygpt.TinyGPT"

    class Counting(TinyGPT):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            calls.append("val")
            return super().validation_step(batch, batch_idx)

    return Counting(TinyGPTConfig(**section["init_args"]["config"]))


def fit(data: Path, **eval_data: str) -> tuple[list[str], list[str]]:
    """(warning messages, validation calls) of a 2-step fit validating every step."""
    from lightning_module import BCLDataModule
    from tests.trainers import cpu_trainer

    calls: list[str] = []
    module = BCLDataModule(
        str(data), plan={"pack_size": 4, "window": 2}, batch={"max_seq_len": 128}, eval=eval_data
    )
    trainer = cpu_trainer(max_steps=2, val_check_interval=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(demo_model(calls), module)
    return [str(w.message) for w in seen], calls


def test_fit_without_validation_data_warns_no_empty_list(mds_dir: Path) -> None:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    messages, calls = fit(mds_dir)
    assert not [m for m in messages if EMPTY in m], messages
    assert calls == []  # the loop is skipped, not run over nothing
    from lightning_module import BCLDataModule

    module = BCLDataModule(str(mds_dir))
    assert not is_overridden("val_dataloader", module)
    assert not is_overridden("test_dataloader", module)


def test_fit_with_validation_data_validates(mds_dir: Path) -> None:
    messages, calls = fit(mds_dir, val_data=str(mds_dir))
    assert not [m for m in messages if EMPTY in m], messages
    assert len(calls) > 0
