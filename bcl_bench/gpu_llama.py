"""A Llama-shaped decoder in plain torch, the two batch layouts, and a pack timer.

Why hand-written and not ``transformers.LlamaForCausalLM``: the packed layout needs attention
per record (cost sum L_i^2, like flash-attn's varlen kernel), and the stock model under SDPA
either builds a block mask from ``position_ids`` (one SDPA over the whole pack: cost (sum L)^2)
or needs the ``flash_attn`` package, which the device image does not have. Here the packed
path calls ``torch.nn.attention.varlen.varlen_attn`` (flash attention with ``cu_seqlens``)
when the installed torch has it and it runs on the device, and otherwise loops one causal SDPA
per record (``segments``); which one ran is recorded. The padded path is one causal SDPA over
(B, max L): right padding sits after every real token, so a causal kernel gives the real tokens
the same result as a padding mask would, and it keeps the flash kernel (a mask would not).

The architecture follows Llama 3 as its public ``config.json`` describes it (RMSNorm, rotary
positions, grouped-query attention, SwiGLU MLP, tied embeddings for the 1B shape); weights are
random: compute time does not depend on their values.

Timing: forward + backward of one pack (no optimizer step: that runs once per optimizer step,
whatever the packs), CUDA events around it on a GPU, ``time.perf_counter`` on a CPU.
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bcl_stream.cost import ModelShape


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaShape(ModelShape):
    """A Llama decoder's shape: the cost presets' ``ModelShape`` (so ``from_shape`` gives the
    FLOPs model of exactly the model built here) plus what only the forward pass needs."""

    rope_theta: float = 500000.0
    """Rotary position base (``rope_theta``)."""
    max_seq_len: int = 8192
    """Rows of the rotary table: the longest record a pack may hold."""


LLAMA_1B = LlamaShape(
    n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, ffn_hidden=8192, vocab_size=128256
)
"""meta-llama/Llama-3.2-1B config.json: 1.24B parameters with tied embeddings."""
TINY = LlamaShape(
    n_layers=2,
    d_model=64,
    n_heads=4,
    n_kv_heads=2,
    ffn_hidden=256,
    vocab_size=1024,
    max_seq_len=1024,
)
"""The CPU smoke-test shape: same code, a few milliseconds per pack."""


def _varlen() -> Callable[..., Any] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape, packed_backend: str) -> None:
        super().__init__()
        self.h, self.kv, self.hd = shape.n_heads, shape.n_kv_heads, shape.d_model // shape.n_heads
        self.wq = nn.Linear(shape.d_model, self.h * self.hd, bias=False)
        self.wk = nn.Linear(shape.d_model, self.kv * self.hd, bias=False)
        self.wv = nn.Linear(shape.d_model, self.kv * self.hd, bias=False)
        self.wo = nn.Linear(self.h * self.hd, shape.d_model, bias=False)
        self.packed_backend = packed_backend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: dict
    ) -> torch.Tensor:
        lead = x.shape[:-1]  # (B, L) padded, (T,) packed
        q = rope(self.wq(x).view(*lead, self.h, self.hd), cos, sin)
        k = rope(self.wk(x).view(*lead, self.kv, self.hd), cos, sin)
        v = self.wv(x).view(*lead, self.kv, self.hd)
        if x.ndim == 3:  # padded: (B, H, L, hd), one causal kernel over the padded rectangle
            k, v = repeat_kv(k, self.h), repeat_kv(v, self.h)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)
        elif self.packed_backend == "varlen":
            out = varlen_causal(q, k, v, batch["cu_seqlens"], batch["max_len"])
        else:
            out = segments_causal(q, repeat_kv(k, self.h), repeat_kv(v, self.h), batch["bounds"])
        return self.wo(out.reshape(*lead, self.h * self.hd))


def repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query key/value heads (..., kv, hd) repeated to (..., heads, hd), as Llama's
    reference code does: every SDPA backend takes equal head counts (``enable_gqa`` is newer
    and not supported by all of them)."""
    return t if t.shape[-2] == heads else t.repeat_interleave(heads // t.shape[-2], dim=-2)


def segments_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[tuple[int, int]]
) -> torch.Tensor:
    """One causal SDPA per record of a packed (T, heads, hd) batch: cost sum L_i^2."""
    parts = []
    for start, end in bounds:
        qs, ks, vs = (t[start:end].transpose(0, 1)[None] for t in (q, k, v))
        parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1))
    return torch.cat(parts)


def varlen_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int
) -> torch.Tensor:
    """Causal varlen flash attention on (T, heads, hd), across torch's two signatures
    (``is_causal`` in 2.10, ``window_size=(-1, 0)`` after) and with or without ``enable_gqa``."""
    fn = _varlen()
    if fn is None:
        raise RuntimeError("torch.nn.attention.varlen is not in this torch")
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return fn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions (rotate-half form) on (..., heads, hd); cos/sin (..., 1, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Block(nn.Module):
    def __init__(self, shape: LlamaShape, packed_backend: str) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(shape.d_model, eps=1e-5)
        self.attn = Attention(shape, packed_backend)
        self.mlp_norm = nn.RMSNorm(shape.d_model, eps=1e-5)
        self.gate = nn.Linear(shape.d_model, shape.ffn_hidden, bias=False)
        self.up = nn.Linear(shape.d_model, shape.ffn_hidden, bias=False)
        self.down = nn.Linear(shape.ffn_hidden, shape.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: dict
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, batch)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Decoder with tied input/output embeddings; ``loss(batch)`` takes either layout."""

    cos: torch.Tensor
    sin: torch.Tensor
    """Rotary tables (buffers, float32 whatever the weights' dtype)."""

    def __init__(self, shape: LlamaShape, packed_backend: str = "segments") -> None:
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab_size, shape.d_model)
        self.layers = nn.ModuleList(Block(shape, packed_backend) for _ in range(shape.n_layers))
        self.norm = nn.RMSNorm(shape.d_model, eps=1e-5)
        hd = shape.d_model // shape.n_heads
        inv = 1.0 / shape.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(shape.max_seq_len, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for module in self.modules():  # Llama's initializer_range
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def to_dtype(self, dtype: torch.dtype) -> Llama:
        """Weights in ``dtype``; the rotary tables stay float32 (positions up to thousands
        need more precision than bf16's 8 bits)."""
        cos, sin = self.cos, self.sin
        self.to(dtype)
        self.cos, self.sin = cos, sin
        return self

    def loss(self, batch: dict) -> torch.Tensor:
        ids, pos = batch["input_ids"], batch["positions"]
        cos, sin = self.cos[pos].unsqueeze(-2), self.sin[pos].unsqueeze(-2)
        x = self.embed(ids)
        for block in self.layers:
            x = block(x, cos, sin, batch)
        logits = F.linear(self.norm(x), self.embed.weight)
        labels = batch["labels"]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        return loss / batch["n_labels"]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_batch(
    lengths: list[int], layout: str, vocab: int, device: torch.device, rng: np.random.Generator
) -> dict[str, Any]:
    """Random token ids for records of ``lengths`` in ``layout``. Labels are the next token of
    the same record, -100 on a record's last token and on padding, so both layouts train on
    the same positions."""
    seqs = [rng.integers(0, vocab, int(n)) for n in lengths]
    n_labels = sum(max(int(n) - 1, 0) for n in lengths)
    if layout == "padded":
        width = max(int(n) for n in lengths)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        labels = np.full((len(seqs), width), -100, dtype=np.int64)
        for row, seq in enumerate(seqs):
            ids[row, : seq.size] = seq
            labels[row, : seq.size - 1] = seq[1:]
        positions = np.broadcast_to(np.arange(width), ids.shape).copy()
        extra: dict[str, Any] = {}
    else:
        ids = np.concatenate(seqs).astype(np.int64)
        labels = np.concatenate(
            [np.append(seq[1:], -100) if seq.size else seq for seq in seqs]
        ).astype(np.int64)
        positions = np.concatenate([np.arange(seq.size) for seq in seqs])
        cu = np.concatenate([[0], np.cumsum([seq.size for seq in seqs])])
        extra = {
            "cu_seqlens": torch.as_tensor(cu, dtype=torch.int32, device=device),
            "max_len": int(max(lengths)),
            "bounds": [(int(a), int(b)) for a, b in itertools.pairwise(cu) if b > a],
        }
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "labels": torch.as_tensor(labels, device=device),
        "positions": torch.as_tensor(np.ascontiguousarray(positions), device=device),
        "n_labels": max(n_labels, 1),
        **extra,
    }


def make_step(model: Llama) -> Callable[[dict[str, Any]], None]:
    """Forward + backward of one pack, gradients dropped first (no optimizer step)."""
    params = list(model.parameters())

    def step(batch: dict[str, Any]) -> None:
        for p in params:
            p.grad = None
        model.loss(batch).backward()

    return step


def time_step(
    step: Callable[[dict[str, Any]], None], batch: dict[str, Any], device: torch.device
) -> float:
    """Seconds of one step: CUDA events on a GPU (device time between two points on the
    stream, launch gaps included), perf_counter on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(batch)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    began = time.perf_counter()
    step(batch)
    return time.perf_counter() - began


def probe_packed_attention(
    shape: LlamaShape, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Which packed attention runs here: varlen flash attention if it runs forward and backward
    and matches per-record SDPA; else ``segments``. The reason is recorded either way."""
    out: dict[str, Any] = {"backend": "segments", "varlen_available": _varlen() is not None}
    if _varlen() is None:
        out["why"] = "torch.nn.attention.varlen not in this torch"
        return out
    hd = shape.d_model // shape.n_heads
    gen = torch.Generator(device="cpu").manual_seed(0)
    lengths = [5, 130, 17, 64]
    total = sum(lengths)
    q = torch.randn(total, shape.n_heads, hd, generator=gen).to(device, dtype).requires_grad_()
    k = torch.randn(total, shape.n_kv_heads, hd, generator=gen).to(device, dtype).requires_grad_()
    v = torch.randn(total, shape.n_kv_heads, hd, generator=gen).to(device, dtype).requires_grad_()
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)
    try:
        got = varlen_causal(q, k, v, cu, max(lengths))
        got.float().sum().backward()
    except Exception as exc:  # any failure means: not usable here; record it and fall back
        out["why"] = f"varlen_attn failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return out
    bounds = list(itertools.pairwise(cu.tolist()))
    heads = shape.n_heads
    ref = segments_causal(
        q.detach(), repeat_kv(k.detach(), heads), repeat_kv(v.detach(), heads), bounds
    )
    diff = float((got.detach().float() - ref.float()).abs().max())
    out["max_abs_diff_vs_segments"] = diff
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    if diff > tol * math.sqrt(hd):
        out["why"] = f"varlen_attn differs from per-record SDPA by {diff:.3g}"
        return out
    out["backend"] = "varlen"
    out["why"] = "varlen_attn ran forward and backward and matched per-record SDPA"
    return out


def probe_padded_kernels(
    shape: LlamaShape, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Which fused SDPA kernels accept the padded layout's call (causal, no mask, equal heads)
    here. The dispatcher picks among those that do; the first fused one in torch's priority
    order is normally the one that ran."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hd = shape.d_model // shape.n_heads
    q = torch.randn(2, shape.n_heads, 96, hd, device=device, dtype=dtype)
    runs: dict[str, Any] = {}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            runs[name.lower()] = True
        except Exception as exc:  # a probe: any refusal means "does not run here"
            runs[name.lower()] = f"no: {str(exc).splitlines()[0][:120]}"
    return runs
