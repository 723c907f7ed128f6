"""One optimizer step of a plain PyTorch DDP loop (torchrun, gloo) over ``PackLoader``, with
gradient accumulation 2 and SGD at lr 1, the normalization done as docs/pytorch.md shows it:
the parameter change is minus the step's gradient. No Lightning and no ``lightning_module``.

Usage: torchrun --nproc_per_node 2 plain_step_gradients.py RUNS, RUNS a JSON list of runs, each
``{"data", "model_dir", "out", "scope", "max_seq_len"}`` (``max_seq_len`` 0: none), one after the
other in the same process group (one start of the ranks for all; each run's ``data`` a
directory of its own: streaming refuses a local directory a live dataset of the process still
holds). Each starts from OUT/init.pt (what the DataModule run started from); writes
OUT/plain_final.pt (rank 0, after the step), OUT/plain_batches_rank{r}.json (each
micro-batch's record ids) and OUT/plain_normalization.txt (the resolved path).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

from bcl_stream import (
    BatchOptions,
    PlanKnobs,
    TrainingContext,
    TrainingKnobs,
    open_training,
    step_loss_tokens,
)

torch.set_num_threads(1)
IGNORE_INDEX = -100
ACCUMULATION = 2


def step(data: str, model_dir: str, out: str, scope: str, max_seq_len: int) -> None:
    out_dir = Path(out)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir, attn_implementation="sdpa"))
    model.load_state_dict(torch.load(out_dir / "init.pt"))
    model.train()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    knobs = TrainingKnobs(
        plan=PlanKnobs(pack_size=2, window=2, scope=scope),
        batch=BatchOptions(collate="padded", labels="unshifted", max_seq_len=max_seq_len or None),
        seed=3,
    )
    context = TrainingContext.of_process_group(
        grad_accum=ACCUMULATION, max_seq_len=model.config.max_position_embeddings
    )
    training = open_training(data, knobs, context)
    batches = iter(training.loader())

    micro = [next(batches) for _ in range(ACCUMULATION)]  # one optimizer step
    denominator = step_loss_tokens(micro, training.resolved.labels)
    world = dist.get_world_size()
    for i, batch in enumerate(micro):
        logits = ddp(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"])
        logits = logits.logits.float()[:, :-1]
        labels = batch["labels"].long()[:, 1:]
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction="sum",
        )  # fmt: skip
        # DDP averages gradients over the ranks: times world over the step's count, the step's
        # gradient is that of the mean over every trained token of the step
        loss = total * world / max(denominator, 1)
        if i < ACCUMULATION - 1:
            with ddp.no_sync():
                loss.backward()
        else:
            loss.backward()
    optimizer.step()

    rank = dist.get_rank()
    ids = [b["sample_ids"].tolist() for b in micro]
    (out_dir / f"plain_batches_rank{rank}.json").write_text(json.dumps(ids))
    if rank == 0:
        torch.save(model.state_dict(), out_dir / "plain_final.pt")
        (out_dir / "plain_normalization.txt").write_text(training.resolved.normalization)


def main(runs: str) -> None:
    dist.init_process_group("gloo")
    for run in json.loads(runs):
        step(**run)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
