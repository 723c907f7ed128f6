"""A Hugging Face tokenizer directory read without ``transformers``: its ``tokenizer.json``
through the ``tokenizers`` library, its special tokens and chat template from its JSON files,
and the template rendered in the Jinja environment ``transformers`` builds for chat templates.

Why: ``import transformers`` imports torch when torch is installed (3-7 s of CPU before the
first record, in every process that tokenizes), and ``apply_chat_template`` adds Python
overhead to every call (the special-tokens map rebuilt, a ``BatchEncoding`` built). What a
conversation's ids depend on is small: the template, rendered with the special tokens and the
template variables, and the directory's ``tokenizer.json`` applied to the text with no special
tokens added. This module reproduces exactly that (``transformers`` 4.57,
``utils/chat_template_utils.py`` and ``PreTrainedTokenizerBase.apply_chat_template``):

- the environment: ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with
  the ``{% generation %}`` extension and ``loopcontrols``, the ``tojson`` filter that does not
  escape HTML, and the ``raise_exception`` and ``strftime_now`` globals;
- the template variables: the directory's special-tokens map (``bos_token``, ``eos_token``, ...,
  ``additional_special_tokens`` and the ``extra_special_tokens``), under the caller's variables;
- the tokenizer as ``PreTrainedTokenizerFast`` sets it up: no padding, no truncation, the
  pre-tokenizer's ``add_prefix_space`` set to the config's (False when it does not say);
- the assistant mask of a ``{% generation %}`` template: every generation block's characters
  mapped to tokens by ``Encoding.char_to_token``, the rule (and the loop) of
  ``return_assistant_tokens_mask``.

A directory whose loading ``transformers`` changes in ways not reproduced here is not read
this way (:func:`read_hf_dir` says why, and the caller loads it with ``transformers``): a
``tokenizer_class`` outside :data:`CLASS_DEFAULTS` (their constructors' default special tokens
are part of the map), ``from_slow``, ``split_special_tokens`` or a Llama tokenizer's
``add_prefix_space`` (the tokenizer is rebuilt from sentencepiece), an ``added_tokens.json``, added tokens the ``tokenizer.json`` does not
hold, or several named chat templates in files. ``tests/unit/test_hf_dir.py`` compares the
special-tokens map, renderings, ids and masks with ``transformers`` on each class.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SPECIAL_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)
"""``PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES``: the special-tokens map's keys."""
CLASS_DEFAULTS: dict[str, dict[str, str | None]] = {
    "PreTrainedTokenizerFast": {},
    "Qwen2Tokenizer": {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                       "pad_token": "<|endoftext|>"},
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GemmaTokenizer": {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>",
                       "pad_token": "<pad>"},
}  # fmt: skip
"""Tokenizer classes read here, each with the special tokens its fast class's constructor
defaults to (a key missing from the directory's files takes that value in ``transformers``).
``Fast`` spellings of the names are the same classes."""


@dataclass(frozen=True, slots=True)
class HFDir:
    """What a conversation's ids need from a tokenizer directory."""

    path: str
    tokenizer: Any
    """The ``tokenizers.Tokenizer`` of its ``tokenizer.json`` (no padding, no truncation)."""
    special_tokens: dict[str, Any]
    """The special-tokens map ``transformers`` gives a template (strings, and a list of
    strings for ``additional_special_tokens``)."""
    chat_template: str | None
    """The default chat template (None: the directory has none)."""


def _token(value: Any) -> Any:
    """A special token as a string (an ``AddedToken`` dict by its content)."""
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token(v) for v in value]
    return value


def _json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        value = json.load(fh)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def read_hf_dir(directory: str) -> HFDir | str:
    """The directory read without ``transformers``, or why it must be loaded with it."""
    config = _json(os.path.join(directory, "tokenizer_config.json"))
    cls = str(config.get("tokenizer_class") or "PreTrainedTokenizerFast")
    defaults = {name.removesuffix("Fast"): d for name, d in CLASS_DEFAULTS.items()}
    if cls.removesuffix("Fast") not in defaults:
        return f"tokenizer_class {cls!r}"
    if config.get("from_slow") or config.get("split_special_tokens"):
        return "tokenizer_config.json sets from_slow or split_special_tokens"
    prefix_space = config.get("add_prefix_space", False)
    if not isinstance(prefix_space, bool) or (prefix_space and cls.startswith("Llama")):
        return f"tokenizer_config.json sets add_prefix_space {prefix_space!r}"
    if os.path.exists(os.path.join(directory, "added_tokens.json")):
        return "an added_tokens.json"
    if os.path.isdir(os.path.join(directory, "additional_chat_templates")):
        return "named chat templates in additional_chat_templates/"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    for key, added in (config.get("added_tokens_decoder") or {}).items():
        if tok.token_to_id(str(added.get("content"))) != int(key):
            return f"added token {added.get('content')!r} is not id {key} in tokenizer.json"
    tok.no_padding()  # what transformers does before encoding without padding/truncation
    tok.no_truncation()
    _set_prefix_space(tok, prefix_space)
    special = _special_tokens(directory, config, defaults[cls.removesuffix("Fast")])
    return HFDir(directory, tok, special, _chat_template(directory, config))


def _set_prefix_space(tok: Any, prefix_space: bool) -> None:
    """What ``PreTrainedTokenizerFast.__init__`` does to every tokenizer it loads: a top-level
    pre-tokenizer whose ``add_prefix_space`` differs from the config's (False when the config
    does not say) is rebuilt with the config's value; one that cannot be read is left alone."""
    from tokenizers import pre_tokenizers

    try:
        state = json.loads(tok.pre_tokenizer.__getstate__())
        if state.get("add_prefix_space", prefix_space) != prefix_space:
            kind = getattr(pre_tokenizers, state.pop("type"))
            state["add_prefix_space"] = prefix_space
            tok.pre_tokenizer = kind(**state)
    except Exception:  # transformers ignores the same failures
        pass


def _special_tokens(
    directory: str, config: dict[str, Any], defaults: dict[str, str | None]
) -> dict[str, Any]:
    """``tokenizer.special_tokens_map`` as ``from_pretrained`` builds it: the class's
    defaults, under ``tokenizer_config.json``, plus ``extra_special_tokens``; empty values left
    out. ``special_tokens_map.json`` is read only by the legacy path (a config without
    ``added_tokens_decoder``), where it overrides the config (its
    ``additional_special_tokens`` appended to the config's)."""
    values: dict[str, Any] = dict(defaults)
    values.update({k: _token(config[k]) for k in SPECIAL_ATTRIBUTES if k in config})
    path = os.path.join(directory, "special_tokens_map.json")
    if "added_tokens_decoder" not in config and os.path.isfile(path):
        for key, value in _json(path).items():
            if key == "additional_special_tokens" and isinstance(value, list):
                merged = list(values.get("additional_special_tokens") or [])
                merged += [t for t in _token(value) if t not in merged]
                value = merged
            values[key] = _token(value)
    extra = config.get("extra_special_tokens") or {}
    keys = list(SPECIAL_ATTRIBUTES) + [k for k in extra if k not in SPECIAL_ATTRIBUTES]
    values.update({k: _token(v) for k, v in extra.items()})
    return {k: values[k] for k in keys if values.get(k)}


def _chat_template(directory: str, config: dict[str, Any]) -> str | None:
    """``chat_template.jinja`` (which ``transformers`` prefers), else the config's
    ``chat_template``: a string, or the ``default`` of a list of named templates."""
    path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read() or None  # an empty template is none (as the old reading had it)
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}.get("default")
    return template if isinstance(template, str) and template else None


def read_chat_template(path: str) -> str:
    """A chat template file (Jinja text, or a ``tokenizer_config.json`` / ``.json`` holding
    ``chat_template``), as ``--chat-template`` names it."""

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: cannot read it ({exc})") from exc
    if path.endswith(".json"):
        try:
            value = json.loads(text).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"--chat-template {path}: not a JSON object ({exc})") from exc
        if not isinstance(value, str) or not value:
            raise ValueError(f"--chat-template {path}: no string 'chat_template' in it")
        text = value
    if not text.strip():
        raise ValueError(f"--chat-template {path}: the file is empty")
    return text


class _Tracker:
    """Where the ``{% generation %}`` blocks of one rendering lie (characters)."""

    def __init__(self) -> None:
        self.blocks: list[str] | None = None
        self.indices: list[tuple[int, int]] | None = None


@functools.lru_cache(maxsize=32)
def compile_template(template: str) -> tuple[Any, _Tracker]:
    """``template`` compiled in ``transformers``' chat-template environment (cached), and the
    tracker its ``{% generation %}`` blocks report to."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    tracker = _Tracker()

    class Generation(Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2 reads the class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_generation", [], [], None, None)
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation(self, caller: Any) -> str:
            text = str(caller())
            if tracker.blocks or tracker.indices:  # transformers' test: nothing yet, no record
                assert tracker.blocks is not None and tracker.indices is not None
                start = len("".join(tracker.blocks))
                tracker.indices.append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template), tracker


def _variables(
    directory: HFDir, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any]
) -> dict[str, Any]:
    if tools is not None and any(not isinstance(tool, dict) for tool in tools):
        raise ValueError(
            "Tools should either be a JSON schema, or a callable function with type hints "
            "and a docstring suitable for auto-conversion to a schema."
        )
    return {
        **directory.special_tokens,
        **kwargs,
        "tools": tools,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
    }


def render(
    directory: HFDir,
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: Any = None,
    add_generation_prompt: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> str:
    """``apply_chat_template(messages, tokenize=False, ...)`` of ``template``."""
    variables = _variables(directory, tools, add_generation_prompt, kwargs or {})
    return str(compile_template(template)[0].render(messages=messages, **variables))


@contextmanager
def _tracking(tracker: _Tracker) -> Iterator[tuple[list[str], list[tuple[int, int]]]]:
    tracker.blocks, tracker.indices = [], []
    try:
        yield tracker.blocks, tracker.indices
    finally:
        tracker.blocks = tracker.indices = None


def render_generation(
    directory: HFDir,
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: Any = None,
    kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """``apply_chat_template(messages, tokenize=True, return_dict=True,
    return_assistant_tokens_mask=True)``: (input_ids, assistant_masks)."""
    compiled, tracker = compile_template(template)
    variables = _variables(directory, tools, False, kwargs or {})
    with _tracking(tracker) as (blocks, indices):
        for block in compiled.generate(messages=messages, **variables):
            blocks.append(block)
        text = "".join(blocks)
        ranges = list(indices)
    encoding = directory.tokenizer.encode(text, add_special_tokens=False)
    ids = list(encoding.ids)
    mask = [0] * len(ids)
    for start, end in ranges:  # transformers' loop, its quirks included
        first = encoding.char_to_token(start, 0)
        last = encoding.char_to_token(end - 1, 0)
        if first is None:
            break
        for token in range(first, last + 1 if last else len(ids)):
            mask[token] = 1
    return ids, mask
