"""The GPU check's model computes the same loss and gradients from both batch layouts, so the
timings of the two layouts compare the same work, and its batches label the right tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcl_bench.gpu_llama import TINY, Llama, make_batch

CPU = torch.device("cpu")


def test_batches_label_the_next_token_of_the_same_record_only() -> None:
    lengths = [3, 1, 5]
    packed = make_batch(lengths, "packed", TINY.vocab_size, CPU, np.random.default_rng(0))
    padded = make_batch(lengths, "padded", TINY.vocab_size, CPU, np.random.default_rng(0))
    ids, labels = packed["input_ids"], packed["labels"]
    assert packed["cu_seqlens"].tolist() == [0, 3, 4, 9] and packed["max_len"] == 5
    assert packed["positions"].tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4]
    assert labels.tolist()[:4] == [ids[1].item(), ids[2].item(), -100, -100]
    assert padded["input_ids"].shape == (3, 5)
    assert (padded["labels"] != -100).sum().item() == packed["n_labels"] == 2 + 0 + 4
    for row, n in enumerate(lengths):  # same tokens, right-padded
        start = sum(lengths[:row])
        assert padded["input_ids"][row, :n].tolist() == ids[start : start + n].tolist()


def test_packed_and_padded_give_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = Llama(TINY, "segments")
    lengths = [7, 33, 2, 18]
    grads = []
    losses = []
    for layout in ("packed", "padded"):
        batch = make_batch(lengths, layout, TINY.vocab_size, CPU, np.random.default_rng(1))
        model.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_bf16_weights_keep_float32_rotary_tables() -> None:
    model = Llama(TINY).to_dtype(torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16
    assert model.cos.dtype == model.sin.dtype == torch.float32
