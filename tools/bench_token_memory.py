"""Peak memory against the tokens of one micro-batch, measured on CPU, for choosing ``max_tokens``.

For each T of ``--tokens`` (and with and without activation checkpointing), a fresh process
builds ``HFCausalLM`` (the project's Hugging Face module) on a small random Llama (float32),
runs one warm-up step of 64 tokens, then one forward and backward of a micro-batch of T tokens
(``loss_sum`` then ``backward``), and reports the growth of its peak resident memory
(``ru_maxrss``) over the warm-up's: the memory that depends on T. A least-squares line
``memory = a + b * T`` is fitted per setting; ``b`` (bytes per token) is what sets T on a GPU.

The micro-batch is one row of T tokens with causal attention and no mask: on CPU, torch's
scaled-dot-product attention then runs its flash kernel, whose memory is linear in T, as
flash-attention's varlen kernel is on a GPU for T tokens of packed records (``HFCausalLM``'s
CPU path for packed records builds a (T, T) mask instead, which only CPU tests use). Next to
each measured ``b`` stands the estimate of ``per_token_bytes`` from the model's shape, the
arithmetic docs/choosing_max_tokens.md applies to Llama-3-8B on an H200.

    python tools/bench_token_memory.py                 # ~2 minutes on one core
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.harness import RESULTS, bench_parser, run_on_one_core, write_result

SHAPE = {"hidden": 256, "ffn": 1024, "layers": 4, "heads": 4, "kv_heads": 2, "vocab": 8192}
"""The measured model: Llama-shaped (grouped-query attention, SwiGLU), small enough for CPU."""
TOKENS = (512, 1024, 2048, 3072, 4096)
WARM_UP = 64


def per_token_bytes(
    hidden: int,
    ffn: int,
    layers: int,
    kv_heads: int,
    heads: int,
    vocab: int,
    *,
    act_bytes: int,
    checkpointing: bool,
) -> dict[str, float]:
    """Activation bytes per token from a Llama's shape, counting what autograd keeps per decoder
    layer (``act_bytes`` per element: 2 for bf16, 4 for float32): two RMSNorms (their float32
    input and their output, 2 x (4 + act) h), q, k, v and their rotated copies and the
    attention output (4h + 4kv elements), the SwiGLU's four f-wide tensors (gate, SiLU, up,
    product: 4f), flash attention's log-sum-exp (float32 per head); and at the head, the logits
    and the float32 copy, log-softmax and its gradient cross-entropy keeps (act + 12 bytes per
    vocabulary entry). With activation checkpointing per layer, a layer keeps only its input
    (h) and one layer at a time is recomputed in the backward."""
    kv = hidden * kv_heads // heads
    norms = 2 * (4 + act_bytes) * hidden
    layer = norms + act_bytes * (4 * hidden + 4 * kv + 4 * ffn) + 4 * heads
    logits = (act_bytes + 12) * vocab
    kept = layers * (act_bytes * hidden if checkpointing else layer)
    return {
        "layer_bytes": float(layer),
        "layers_bytes": float(kept + (layer if checkpointing else 0)),
        "logits_bytes": float(logits),
        "total_bytes": float(kept + (layer if checkpointing else 0) + logits),
    }


def child(tokens: int, checkpointing: bool) -> dict[str, Any]:
    """One measurement in this (fresh) process: peak RSS growth of one step of ``tokens``."""
    import torch
    from transformers import LlamaConfig

    from lightning_module.hf_causal_lm import HFCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        LlamaConfig(
            vocab_size=SHAPE["vocab"],
            hidden_size=SHAPE["hidden"],
            intermediate_size=SHAPE["ffn"],
            num_hidden_layers=SHAPE["layers"],
            num_attention_heads=SHAPE["heads"],
            num_key_value_heads=SHAPE["kv_heads"],
            max_position_embeddings=max(TOKENS) + WARM_UP,
        ).save_pretrained(tmp)
        module = HFCausalLM(tmp, attention="sdpa", gradient_checkpointing=checkpointing)

    def step(n: int) -> None:
        ids = torch.randint(0, SHAPE["vocab"], (1, n))
        total, _ = module.loss_sum({"input_ids": ids, "labels": ids.clone()})
        total.backward()

    step(WARM_UP)  # parameters' gradients exist from here on: the growth below is T's alone
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    step(tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "tokens": tokens,
        "checkpointing": checkpointing,
        "peak_growth_bytes": (peak - base) * 1024,  # ru_maxrss is in KiB on Linux
        "seconds": time.perf_counter() - started,
    }


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least-squares ``growth = a + b * T`` over ``rows``, with its largest relative residual."""
    t = np.array([r["tokens"] for r in rows], dtype=float)
    m = np.array([r["peak_growth_bytes"] for r in rows], dtype=float)
    b, a = np.polyfit(t, m, 1)
    residual = np.max(np.abs(m - (a + b * t)) / m)
    return {"a_bytes": float(a), "b_bytes_per_token": float(b), "max_rel_residual": residual}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_token_memory.json")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--child", nargs=2, metavar=("T", "CHECKPOINTING"), help=argparse_hidden)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(int(args.child[0]), args.child[1] == "1")))
        return 0
    settings = {}
    for checkpointing in (False, True):
        rows = []
        for tokens in args.tokens:
            rows.append(
                run_on_one_core([__file__, "--child", str(tokens), str(int(checkpointing))])
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        estimate = per_token_bytes(
            SHAPE["hidden"], SHAPE["ffn"], SHAPE["layers"], SHAPE["kv_heads"], SHAPE["heads"],
            SHAPE["vocab"], act_bytes=4, checkpointing=checkpointing,
        )  # fmt: skip
        measured = fit(rows)
        key = "checkpointing" if checkpointing else "no_checkpointing"
        settings[key] = {
            "rows": rows,
            "fit": measured,
            "shape_estimate": estimate,
            "measured_over_estimate": measured["b_bytes_per_token"] / estimate["total_bytes"],
        }
    result = {
        "model": {**SHAPE, "dtype": "float32", "attention": "sdpa (causal, no mask)"},
        "warm_up_tokens": WARM_UP,
        "settings": settings,
    }
    write_result(result, Path(args.out))
    return 0


argparse_hidden = "internal: one measurement in a fresh process (T, 1 for checkpointing)"

if __name__ == "__main__":
    raise SystemExit(main())
