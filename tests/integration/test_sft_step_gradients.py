"""Loss normalization under DDP with accumulation: 2 gloo ranks, accumulation 2, one SGD step
of HFCausalLM give the gradient of one process on the step's records concatenated (the mean
cross-entropy over all their trained tokens), on each path: the plan gives the step's count
(``step_loss_tokens``, scope ``node`` on one node); each rank's planned count is all-reduced
(scope ``rank``: each reader plans its own rank only); the labels' count is all-reduced and the
gradients rescaled (records truncated with a partial mask: the index cannot give the count)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_process import run_script
from pack_oracles import check_every_record_once
from sft_records import VOCAB, records, trained_positions, write_sft_mds
from transformers import LlamaConfig, LlamaForCausalLM

from tests.hf_models import tiny_llama_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "step_gradients.py"
pytestmark = [pytest.mark.slow, pytest.mark.shared_process]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    recs = records(48)
    return write_sft_mds(tmp_path_factory.mktemp("sft") / "mds", recs), recs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_dir(tmp_path_factory.mktemp("model"), vocab_size=VOCAB)


def reference_update(
    model_dir: Path,
    init: dict[str, torch.Tensor],
    step: list[dict[str, np.ndarray]],
    max_seq_len: int | None,
) -> dict[str, torch.Tensor]:
    """Minus the gradient of the mean CE over every trained token of the step's records, each
    record run alone through a plain LlamaForCausalLM (no packing, no mask, one process)."""
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir))
    model.load_state_dict(init)
    total = torch.zeros(())
    count = 0
    for record in step:
        ids = torch.as_tensor(record["input_ids"][:max_seq_len].astype(np.int64))[None]
        targets = torch.as_tensor(trained_positions(record, max_seq_len))
        count += int(targets.numel())
        if targets.numel():
            logits = model(input_ids=ids).logits.float()[0]
            total = total + F.cross_entropy(logits[targets - 1], ids[0, targets], reduction="sum")
    (total / count).backward()
    return {name: -p.grad for name, p in model.named_parameters() if p.grad is not None}


BUDGET = 64
"""``contract="tokens"``: micro-batches of at most 64 tokens (two or three records here)."""

CASES = [
    ("node", None, "plan", 0),
    ("rank", None, "all_reduce", 0),
    ("rank", 24, "rescale", 0),
    ("node", None, "plan", BUDGET),
    ("rank", None, "all_reduce", BUDGET),
]


@pytest.fixture(scope="module")
def steps(
    data: tuple[Path, list[dict[str, np.ndarray]]],
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, int | None, int], Path]:
    """Every case's step, all in one process (``scripts/step_gradients.py`` takes a list of
    runs: one interpreter start for the five): case -> its output directory."""
    root = tmp_path_factory.mktemp("steps")
    outs: dict[tuple[str, int | None, int], Path] = {}
    runs = []
    for i, (scope, max_seq_len, _, budget) in enumerate(CASES):
        out = root / f"case{i}"
        out.mkdir()
        outs[scope, max_seq_len, budget] = out
        runs.append(
            {
                "data": str(shutil.copytree(data[0], root / f"data{i}")),  # a local dir each
                "model_dir": str(model_dir),
                "out": str(out),
                "scope": scope,
                "max_seq_len": max_seq_len or 0,
                "budget": budget,
            }
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BCL_STREAM_KEEP_SHM": "1"}
    run = run_script(SCRIPT, json.dumps(runs), env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return outs


@pytest.mark.parametrize(("scope", "max_seq_len", "normalization", "budget"), CASES)
def test_ddp_accumulated_step_equals_one_process_on_the_whole_step(
    data: tuple[Path, list[dict[str, np.ndarray]]],
    model_dir: Path,
    steps: dict[tuple[str, int | None, int], Path],
    scope: str,
    max_seq_len: int | None,
    normalization: str,
    budget: int,
) -> None:
    """Also under the tokens contract, whose micro-batches hold varying records: the step's
    denominator from the plan (or the ranks' planned counts) stays exact."""
    recs = data[1]
    out = steps[scope, max_seq_len, budget]
    assert (out / "normalization.txt").read_text() == normalization
    batches = [json.loads((out / f"batches_rank{r}.json").read_text()) for r in range(2)]
    assert [len(b) for b in batches] == [2, 2]  # accumulation 2, one optimizer step
    ids = [i for rank in batches for b in rank for i in b["sample_ids"]]
    check_every_record_once(ids)
    step = [recs[i] for i in ids]
    if budget:  # records per micro-batch vary, none holds more than the budget
        sizes = [len(b["sample_ids"]) for rank in batches for b in rank]
        assert len(set(sizes)) > 1 or sizes[0] != 2
        for rank in batches:
            for b in rank:
                assert sum(recs[i]["input_ids"].size for i in b["sample_ids"]) <= budget
    else:
        assert len(ids) == 8
    want_tokens = sum(trained_positions(r, max_seq_len).size for r in step)
    assert sum(b["loss_tokens"] for rank in batches for b in rank) == want_tokens
    steps = {b["step_loss_tokens"] for rank in batches for b in rank}
    assert steps == ({want_tokens} if normalization == "plan" else {None})
    for rank in batches:  # each rank's planned share of the step (all_reduce only)
        own = {b["rank_step_loss_tokens"] for b in rank}
        mine = sum(b["loss_tokens"] for b in rank)
        assert own == ({mine} if normalization == "all_reduce" else {None})
    if max_seq_len is not None:  # the cut reaches a partially trained record of the step
        assert any(r["input_ids"].size > max_seq_len for r in step)

    init = torch.load(out / "init.pt")
    final = torch.load(out / "final.pt")
    update = reference_update(model_dir, init, step, max_seq_len)
    assert update, "no gradient"
    for name, delta in update.items():
        torch.testing.assert_close(final[name] - init[name], delta, rtol=1e-4, atol=1e-6)
