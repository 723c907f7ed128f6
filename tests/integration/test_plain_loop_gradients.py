"""A plain PyTorch loop over ``PackLoader`` trains what the DataModule trains (issue 40, item 1).

On the same data, from the same parameters, one optimizer step on 2 gloo ranks with
accumulation 2 and SGD at lr 1: ``BCLDataModule`` under a Lightning ``Trainer`` with
``HFCausalLM`` (``scripts/step_gradients.py``), and a plain torchrun loop over
``bcl_stream.open_training`` with the normalization docs/pytorch.md documents
(``scripts/plain_step_gradients.py``: no Lightning). Both resolve through the core, so each
rank gets the same micro-batches, the same normalization path is taken, and the parameter
change (minus the step's gradient) is the same, on each of the three paths: the plan's count
(scope ``node``), the ranks' planned counts all-reduced (scope ``rank``), the labels' count
all-reduced (records truncated with a partial mask)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_process import run_module, run_script
from sft_records import VOCAB, records, write_sft_mds

from tests.hf_models import tiny_llama_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sft_mds(tmp_path_factory.mktemp("sft") / "mds", records(48))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_dir(tmp_path_factory.mktemp("model"), vocab_size=VOCAB)


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "BCL_STREAM_KEEP_SHM": "1"}


def check(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


CASES = [("node", None, "plan"), ("rank", None, "all_reduce"), ("rank", 24, "rescale")]


@pytest.fixture(scope="module")
def steps(
    data: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, int | None], Path]:
    """Every case's step through both: the DataModule's runs in one process, then the plain
    loop's in one torchrun job (each script takes a list of runs: two starts for the three
    cases, not six): case -> the output directory both wrote."""
    root = tmp_path_factory.mktemp("steps")
    outs: dict[tuple[str, int | None], Path] = {}
    runs = []
    for i, (scope, max_seq_len, _) in enumerate(CASES):
        out = root / f"case{i}"
        out.mkdir()
        outs[scope, max_seq_len] = out
        local = shutil.copytree(data, root / f"data{i}")  # a local dir of each run's own
        common = {"data": str(local), "model_dir": str(model_dir), "out": str(out)}
        runs.append(common | {"scope": scope, "max_seq_len": max_seq_len or 0})
    lightning = [r | {"budget": 0, "collate": "padded"} for r in runs]
    # Both forked from the tests' pre-imported server (tests/cli_process.py): the Lightning
    # script's second rank is forked from its first (ddp_fork); torchrun's launcher is
    # forked, and it starts its two workers as fresh interpreters, as torchrun does.
    check(run_script(SCRIPTS / "step_gradients.py", json.dumps(lightning), env=ENV, timeout=600))
    plain = SCRIPTS / "plain_step_gradients.py"
    torchrun = ("--standalone", "--nproc_per_node", "2", str(plain), json.dumps(runs))
    check(run_module("torch.distributed.run", *torchrun, env=ENV, timeout=600))
    return outs


@pytest.mark.parametrize(("scope", "max_seq_len", "normalization"), CASES)
def test_a_plain_torchrun_loop_steps_as_the_datamodule_does(
    steps: dict[tuple[str, int | None], Path],
    scope: str,
    max_seq_len: int | None,
    normalization: str,
) -> None:
    out = steps[scope, max_seq_len]
    assert (out / "normalization.txt").read_text() == normalization
    assert (out / "plain_normalization.txt").read_text() == normalization
    for rank in range(2):
        lightning = json.loads((out / f"batches_rank{rank}.json").read_text())
        plain_ids = json.loads((out / f"plain_batches_rank{rank}.json").read_text())
        assert plain_ids == [b["sample_ids"] for b in lightning]

    init = torch.load(out / "init.pt")
    final = torch.load(out / "final.pt")
    plain_final = torch.load(out / "plain_final.pt")
    assert final.keys() == plain_final.keys()
    moved = 0
    for name, before in init.items():
        want = final[name] - before
        torch.testing.assert_close(plain_final[name] - before, want, rtol=1e-4, atol=1e-6)
        moved += int(np.count_nonzero(want.numpy()))
    assert moved, "the step changed no parameter: nothing was compared"
