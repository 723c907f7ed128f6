"""docs/hf_trainer.md's example runs as the page shows it, and its normalization is the one the
page states.

- The page's python block, with the data and model paths, the output directory and the step
  count changed, trains a tiny Llama for 2 optimizer steps of 2 micro-batches in one CPU
  process under the Hugging Face ``Trainer``, with a finite loss at each step.
- On the same packs, the Trainer's count of a step's trained tokens (labels other than -100
  over its micro-batches, ``Trainer._get_num_items_in_batch``) equals the core's
  ``step_loss_tokens``: the denominator the Trainer divides by is the documented one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from cli_process import run_script
from sft_records import VOCAB, records, write_sft_mds

from tests.hf_models import tiny_llama_dir

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "hf_trainer.md"
SETTINGS = (
    'DATA, MODEL, OUT, STEPS, ACCUMULATION = "/data/sft-mds", "/models/llama", "runs/hf", 100, 4'
)
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


def page_block() -> str:
    from doc_blocks import fenced_blocks

    (_, code), *_ = fenced_blocks(PAGE.read_text(encoding="utf-8"), {"python"})
    assert SETTINGS in code, "docs/hf_trainer.md's example lost the settings line this test changes"
    return code


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sft_mds(tmp_path_factory.mktemp("sft") / "mds", records(48))


def test_the_hf_trainer_page_example_trains(data: Path, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = tiny_llama_dir(tmp_path / "model", vocab_size=VOCAB)
    LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
    settings = f'DATA, MODEL, OUT, STEPS, ACCUMULATION = "{data}", "{model_dir}", "{tmp_path / "out"}", 2, 2'
    report = "\nimport json\nprint('STATE', json.dumps(trainer.state.log_history))\n"
    script = tmp_path / "train.py"
    script.write_text(page_block().replace(SETTINGS, settings) + report)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BCL_STREAM_KEEP_SHM": "1"}
    proc = run_script(script, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STATE "))
    history = json.loads(line.removeprefix("STATE "))
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), history


def test_the_trainers_count_is_the_cores_step_count(data: Path) -> None:
    from bcl_stream import (
        BatchOptions,
        PlanKnobs,
        TrainingContext,
        TrainingKnobs,
        open_training,
        step_loss_tokens,
    )

    knobs = TrainingKnobs(
        plan=PlanKnobs(pack_size=4, window=8, scope="node"),
        batch=BatchOptions(collate="padded", labels="unshifted"),
    )
    training = open_training(data, knobs, TrainingContext.of_process_group(grad_accum=2))
    assert training.resolved.normalization == "plan"
    batches = list(training.loader())
    assert len(batches) >= 4
    for start in range(0, len(batches) - 1, 2):
        micro = batches[start : start + 2]
        hf_count = sum(int(b["labels"].ne(-100).sum()) for b in micro)  # the Trainer's count
        assert hf_count == step_loss_tokens(micro, "unshifted") > 0
