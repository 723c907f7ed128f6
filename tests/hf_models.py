"""Tiny random Hugging Face causal LMs for tests: a ``config.json`` alone (``HFCausalLM``
initialises from it at random), built offline with ``transformers.LlamaConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_llama_dir(
    directory: Path,
    *,
    vocab_size: int = 96,
    max_position_embeddings: int = 64,
    width: int = 32,
    layers: int = 2,
    **extra: Any,
) -> Path:
    """A Llama of ``layers`` decoder layers, hidden size ``width`` (4 query heads, 2 key/value
    heads: grouped-query attention as in Llama-3), saved to ``directory``; ``extra`` goes to
    the config (``bos_token_id``, ...)."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        **extra,
    ).save_pretrained(directory)
    return directory
