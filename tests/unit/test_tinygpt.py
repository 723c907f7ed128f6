"""TinyGPT: the packed (varlen) and padded layouts compute the same loss, and the model shape
matches the ``tinygpt`` cost preset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcl_stream.cost import SHAPES, get_preset
from bcl_stream.loading.collate import collate_packed, collate_padded
from lightning_module.tinygpt import TinyGPT, TinyGPTConfig, block_causal_mask

SMALL = {"vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 4, "ffn_hidden": 64}


def make_pack(lengths: list[int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"input_ids": rng.integers(0, 100277, size=n).astype(np.uint32), "sample_id": i}
        for i, n in enumerate(lengths)
    ]


def model(packed_attention: str = "segments", seed: int = 0, **overrides) -> TinyGPT:
    torch.manual_seed(seed)
    config = TinyGPTConfig(**{**SMALL, **overrides}, packed_attention=packed_attention)
    return TinyGPT(config).eval()


@pytest.mark.parametrize("packed_attention", ["segments", "mask"])
@pytest.mark.parametrize("lengths", [[7], [5, 17, 1, 9], [30, 2, 2, 2, 2, 2], [3, 0, 12], [1, 1]])
def test_packed_and_padded_give_the_same_loss(packed_attention: str, lengths: list[int]) -> None:
    net = model(packed_attention, seed=len(lengths))
    pack = make_pack(lengths, seed=sum(lengths))
    with torch.no_grad():
        padded = net.loss(collate_padded(pack))
        packed = net.loss(collate_packed(pack))
    assert torch.isfinite(padded)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_packed_gradients_match_padded() -> None:
    net = model("segments", seed=3)
    pack = make_pack([6, 13, 2, 9], seed=5)
    grads = []
    for collate in (collate_padded, collate_packed):
        net.zero_grad()
        net.loss(collate(pack)).backward()
        grads.append({n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6)


def test_records_do_not_see_each_other_when_packed() -> None:
    """Changing record 0 must not change record 1's logits (block-diagonal attention)."""
    net = model("mask", seed=1)
    pack = make_pack([8, 6], seed=2)
    other = [dict(pack[0], input_ids=pack[0]["input_ids"] + 1), pack[1]]
    with torch.no_grad():
        a = net(collate_packed(pack))[0, 8:]
        b = net(collate_packed(other))[0, 8:]
    torch.testing.assert_close(a, b)


def test_block_causal_mask_is_exact() -> None:
    mask = block_causal_mask(torch.tensor([0, 2, 2, 5], dtype=torch.int32))
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[:2, :2] = torch.ones(2, 2, dtype=torch.bool).tril()
    expected[2:, 2:] = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(mask, expected)


def test_ids_are_hashed_into_the_vocab() -> None:
    net = model(seed=0)
    pack = make_pack([5, 4], seed=0)
    hashed = [dict(r, input_ids=r["input_ids"] % SMALL["vocab_size"]) for r in pack]
    with torch.no_grad():
        torch.testing.assert_close(net.loss(collate_packed(pack)), net.loss(collate_packed(hashed)))


def test_too_long_record_is_an_error_naming_it() -> None:
    net = model(max_seq_len=8)
    with pytest.raises(ValueError, match=r"max_seq_len=8.*\(1, 9\)"):
        net(collate_packed(make_pack([3, 9], seed=0)))
    net(collate_packed(make_pack([3, 9], seed=0), max_seq_len=8))  # explicit truncation works


def test_default_shape_matches_the_cost_preset() -> None:
    config = TinyGPTConfig()
    shape, _ = SHAPES["tinygpt"]
    assert (shape.n_layers, shape.d_model, shape.n_heads, shape.ffn_hidden, shape.vocab_size) == (
        config.n_layers,
        config.d_model,
        config.n_heads,
        config.ffn_hidden,
        config.vocab_size,
    )
    net = TinyGPT(config)
    matmul = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear))
    assert matmul == shape.matmul_params()
    assert get_preset("tinygpt").b == 6.0 * config.n_layers * config.d_model


def test_training_step_and_optimizer() -> None:
    net = TinyGPT(TinyGPTConfig(**SMALL))
    batch = collate_packed(make_pack([4, 6], seed=0))
    loss = net.training_step(batch, 0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    optimizer = net.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="divisible"):
        TinyGPTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="packed_attention"):
        TinyGPTConfig(packed_attention="flash")


def test_trains_under_a_real_trainer_and_reloads_from_checkpoint(tmp_path) -> None:
    from torch.utils.data import DataLoader

    from tests.trainers import cpu_trainer

    packs = [make_pack([5, 9, 3, 7], seed=s) for s in range(3)]
    loader = DataLoader(packs, batch_size=None, collate_fn=collate_packed)
    net = TinyGPT(TinyGPTConfig(**SMALL, max_seq_len=64))
    before = [p.detach().clone() for p in net.parameters()]
    trainer = cpu_trainer(max_steps=3, default_root_dir=tmp_path)
    trainer.fit(net, loader)
    assert trainer.global_step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    path = tmp_path / "tiny.ckpt"
    trainer.save_checkpoint(path)
    loaded = TinyGPT.load_from_checkpoint(path)
    assert loaded.config == net.config
    batch = collate_packed(packs[0])
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval().loss(batch), net.eval().loss(batch))
