"""docs/pytorch.md's torchrun loop runs as the page shows it: its python block, with the data
and model paths and the step count changed, on 2 gloo ranks under ``torchrun``; every step
prints a finite loss and its trained-token count."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sft_records import VOCAB, records, write_sft_mds

from tests.hf_models import tiny_llama_dir

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pytorch.md"
SETTINGS = 'DATA, MODEL, STEPS, ACCUMULATION = "/data/sft-mds", "/models/llama", 100, 4'
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


def page_block() -> str:
    from doc_blocks import fenced_blocks

    (_, code), *_ = fenced_blocks(PAGE.read_text(encoding="utf-8"), {"python"})
    assert SETTINGS in code, "docs/pytorch.md's loop lost the settings line this test changes"
    return code


def test_the_pytorch_page_loop_runs_on_two_gloo_ranks(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    data = write_sft_mds(tmp_path / "mds", records(48))
    model_dir = tiny_llama_dir(tmp_path / "model", vocab_size=VOCAB)
    LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
    script = tmp_path / "train.py"
    script.write_text(
        page_block().replace(
            SETTINGS, f'DATA, MODEL, STEPS, ACCUMULATION = "{data}", "{model_dir}", 2, 2'
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BCL_STREAM_KEEP_SHM": "1",
        "OMP_NUM_THREADS": "1",
    }
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    proc = subprocess.run(
        [*torchrun, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(r"^step (\d+): loss (\S+) \((\d+) trained tokens\)$", proc.stdout, re.M)
    assert [int(s) for s, _, _ in steps] == [0, 1], proc.stdout
    for _, loss, count in steps:
        assert math.isfinite(float(loss)) and int(count) > 0
