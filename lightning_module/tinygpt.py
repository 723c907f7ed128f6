"""TinyGPT: a small decoder-only transformer whose compute grows with sequence length.

Why this model exists: the demo and the measured benchmarks need a model whose step time
depends on *which* records a pack holds, the way a real LLM's does: every matmul is linear
in the tokens, attention is quadratic in each record's length. It runs on CPU in seconds.

Shape: pre-norm blocks (RMSNorm), multi-head attention through
``torch.nn.functional.scaled_dot_product_attention`` (real quadratic attention), a gated MLP
(SwiGLU: gate/up/down) and an untied LM head. The defaults match the ``tinygpt`` cost preset
in ``bcl_stream.cost`` (tests/unit/test_tinygpt.py checks the matmul parameter count).

Vocabulary hashing: the corpora are tokenized with cl100k (100277 ids). A 100k-wide LM head
would make the head alone ~100x the rest of the model and CPU demo steps far too slow, so
ids are hashed into the model's vocabulary as ``ids % vocab_size`` (inputs and labels alike).
Distinct tokens collide; for a balancing demo that is irrelevant, for a real LM it is not.

Two batch layouts (built by ``bcl_stream.loading.collate``):

- padded: ``input_ids`` (B, T), ``attention_mask`` (B, T) with 1 on real tokens (right
  padding), ``labels`` (B, T) with -100 on padding.
- packed (varlen): ``input_ids`` (1, T_total), ``cu_seqlens`` (B+1,), ``position_ids``
  (1, T_total) restarting at 0 per record, ``labels`` (1, T_total). Attention is
  block-diagonal causal: a token sees only earlier tokens of its own record.

``labels`` are already shifted: ``labels[t]`` is the token that follows position t in the
same record, -100 where there is none (last token of a record, padding). The loss is the
mean over all labelled positions of the batch, so both layouts give the same loss.

Packed attention has two implementations (``TinyGPTConfig.packed_attention``):
``"segments"`` (default) runs causal SDPA once per record, so attention costs sum(L_i^2) like
flash-attn's varlen kernel on a GPU and the per-record cost model c(L) = a*L + b*L^2 + k holds;
``"mask"`` builds the boolean block-diagonal mask from ``cu_seqlens`` and runs one SDPA over
the whole pack, which costs (sum L_i)^2 on CPU (no flash-attn here). Both give the same result
(tests check it); only their cost differs.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_module.parallel import parallelize

IGNORE_INDEX = -100
PACKED_ATTENTION = ("segments", "mask")


@dataclass(kw_only=True)
class TinyGPTConfig:
    """TinyGPT hyperparameters. Defaults = the ``tinygpt`` cost preset in ``bcl_stream.cost``."""

    vocab_size: int = 8192
    """Model vocabulary; token ids are hashed in as ``ids % vocab_size``."""
    d_model: int = 128
    """Hidden size."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads (no grouped-query attention: key/value heads = n_heads)."""
    ffn_hidden: int = 512
    """Gated MLP width (gate, up and down projections)."""
    max_seq_len: int = 4096
    """Longest record (learned position embeddings); longer records are an error."""
    lr: float = 3e-4
    """AdamW learning rate."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    packed_attention: str = "segments"
    """``segments`` (per-record SDPA, cost sum L^2) or ``mask`` (one block-diagonal mask)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyGPTConfig.{name} must be an integer >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TinyGPTConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        if self.packed_attention not in PACKED_ATTENTION:
            raise ValueError(
                f"TinyGPTConfig.packed_attention must be one of {PACKED_ATTENTION}, "
                f"got {self.packed_attention!r}"
            )


class Attention(nn.Module):
    """Multi-head causal self-attention for the padded or the packed layout."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.packed_attention = config.packed_attention
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, cu_seqlens: Tensor | None) -> Tensor:
        batch, seq, d_model = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.n_heads, d_model // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        if cu_seqlens is not None:
            y = self._packed(q, k, v, cu_seqlens)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.out(y.transpose(1, 2).reshape(batch, seq, d_model))

    def _packed(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
        if self.packed_attention == "mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(cu_seqlens))
        bounds = cu_seqlens.tolist()
        parts = [
            F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True)
            for s, e in itertools.pairwise(bounds)
            if e > s
        ]
        return torch.cat(parts, dim=2) if parts else torch.zeros_like(q)


def block_causal_mask(cu_seqlens: Tensor) -> Tensor:
    """(T, T) boolean mask, True where query i may attend key j: same record and j <= i (on
    ``cu_seqlens``' device)."""
    device = cu_seqlens.device
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    total = int(cu_seqlens[-1])
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    same = segment[:, None] == segment[None, :]
    return same & torch.ones(total, total, dtype=torch.bool, device=device).tril()


def padded_causal_mask(attention_mask: Tensor) -> Tensor:
    """(B, 1, T, T) boolean mask: causal, real keys only. Each position may always see itself,
    so padding rows are never fully masked (a fully masked row is NaN in SDPA)."""
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    keys = attention_mask.bool()[:, None, None, :]
    eye = torch.eye(seq, dtype=torch.bool)
    return causal & (keys | eye)


class SwiGLU(nn.Module):
    """Gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.up = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.down = nn.Linear(config.ffn_hidden, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(config.d_model)
        self.attn = Attention(config)
        self.norm2 = nn.RMSNorm(config.d_model)
        self.mlp = SwiGLU(config)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, cu_seqlens: Tensor | None) -> Tensor:
        x = x + self.attn(self.norm1(x), key_mask=key_mask, cu_seqlens=cu_seqlens)
        return x + self.mlp(self.norm2(x))


class TinyGPT(L.LightningModule):
    """The demo's language model; see the module docstring for layouts and hashing."""

    def __init__(self, config: TinyGPTConfig | dict[str, Any] | None = None) -> None:
        super().__init__()
        if isinstance(config, dict):  # from a checkpoint's hyperparameters
            config = TinyGPTConfig(**config)
        self.config = config if config is not None else TinyGPTConfig()
        # "_class_path": the training CLI's model type is any LightningModule, and on
        # `--ckpt_path` it rebuilds the model from these hyperparameters: without the class
        # it would try LightningModule(config=...). load_from_checkpoint ignores the key.
        self.save_hyperparameters(
            {"config": asdict(self.config), "_class_path": f"{__name__}.{type(self).__qualname__}"}
        )
        c = self.config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = nn.RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy`` (a device mesh is set): tensor
        parallelism on the MLPs, FSDP2 across data-parallel ranks (``lightning_module.parallel``;
        the fused ``qkv`` attention stays replicated). Any other strategy: nothing to do."""
        if self.device_mesh is not None:
            parallelize(self, self.device_mesh)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits over the hashed vocabulary, shaped like ``input_ids`` plus a vocab axis."""
        ids = batch["input_ids"].long() % self.config.vocab_size
        cu_seqlens = batch.get("cu_seqlens")
        if cu_seqlens is not None:
            if ids.shape[0] != 1:
                raise ValueError(f"packed layout needs input_ids of shape (1, T), got {ids.shape}")
            positions = batch["position_ids"].long()
            key_mask = None
        else:
            mask = batch.get("attention_mask")
            if mask is None:
                mask = torch.ones_like(ids)
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            key_mask = padded_causal_mask(mask.to(ids.device))
        self._check_length(batch, positions)
        x = self.embed(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x, key_mask=key_mask, cu_seqlens=cu_seqlens)
        return self.head(self.norm(x))

    def _check_length(self, batch: dict[str, Tensor], positions: Tensor) -> None:
        if positions.numel() and int(positions.max()) >= self.config.max_seq_len:
            tokens = batch.get("tokens")
            ids = batch.get("sample_ids")
            detail = ""
            if tokens is not None and ids is not None:
                over = [
                    (int(i), int(t))
                    for i, t in zip(ids, tokens, strict=True)
                    if t > self.config.max_seq_len
                ]
                detail = f" (sample_id, tokens): {over[:5]}"
            raise ValueError(
                f"a record is longer than TinyGPTConfig.max_seq_len={self.config.max_seq_len}"
                f"{detail}; truncate in collate (max_seq_len=...) or raise max_seq_len"
            )

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        """Mean next-token cross-entropy over every labelled position of the batch."""
        logits = self(batch)
        labels = batch["labels"].long()
        labels = torch.where(labels == IGNORE_INDEX, labels, labels % self.config.vocab_size)
        flat = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        count = (labels != IGNORE_INDEX).sum().clamp(min=1)
        return flat / count

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        records = int(batch["sample_ids"].numel()) if "sample_ids" in batch else 1
        self.log("train_loss", loss, prog_bar=True, batch_size=records)
        # contract="step": micro-batches vary in size; weigh this one by its records / B so
        # the accumulated step weighs every record as with exactly B per micro-batch.
        return loss * batch["loss_scale"] if "loss_scale" in batch else loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate("val_loss", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate("test_loss", batch)

    def _evaluate(self, name: str, batch: dict[str, Tensor]) -> Tensor:
        """The loss of an evaluation pack (at most B records), averaged over every rank's
        records (``sync_dist``: every rank runs the same number of packs)."""
        loss = self.loss(batch)
        records = int(batch["sample_ids"].numel()) if "sample_ids" in batch else 1
        self.log(name, loss, prog_bar=True, batch_size=records, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        # Deliberately does not read trainer.estimated_stepping_batches (Lightning #20550:
        # it would stop loader states from being restored on resume).
        return torch.optim.AdamW(
            self.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
