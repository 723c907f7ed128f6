"""A tokenizer directory read without ``transformers`` (``bcl_stream/text/hf_dir.py``) gives
what ``transformers`` gives: the special-tokens map a template sees, for each tokenizer class
read that way and each place a special token can be declared; the renderings of templates that
use the environment's extras (``raise_exception``, ``tojson``, ``strftime_now``, loop controls,
``{% generation %}``); ids and assistant masks. Directories it does not read (a tokenizer
rebuilt on load) go through ``transformers`` and stay exact. The official templates on public
data are compared in ``test_official_templates.py`` (through this module as well).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bcl_stream.text.chat import Conversation
from bcl_stream.text.hf_dir import CLASS_DEFAULTS, read_hf_dir, render, render_generation
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.templates import Encoder, TemplateError
from tests.hf_tokenizers import LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir


def _auto(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, use_fast=True)


def _edit(directory: Path, name: str, change: Any) -> None:
    path = directory / name
    value = json.loads(path.read_text()) if path.exists() else {}
    change(value)
    path.write_text(json.dumps(value))


ADDED = {"lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
VARIANTS = {
    "as saved": lambda c, m: None,
    "no bos in config": lambda c, m: (c.pop("bos_token", None), m.pop("bos_token", None)),
    "no eos anywhere": lambda c, m: (c.pop("eos_token", None), m.pop("eos_token", None)),
    "null unk and pad": lambda c, m: c.update(unk_token=None, pad_token=None),
    "map ignored": lambda c, m: m.update(eos_token="<|eot_id|>"),
    "legacy: map overrides config": lambda c, m: (
        c.pop("added_tokens_decoder"), m.update(eos_token="<|eot_id|>")
    ),
    "legacy: additional in both files": lambda c, m: (
        c.pop("added_tokens_decoder"),
        c.update(additional_special_tokens=["<|im_end|>"]),
        m.update(additional_special_tokens=["<|eot_id|>", "<|im_end|>"]),
    ),
    "added token dicts": lambda c, m: (
        c.update(bos_token={"__type": "AddedToken", **ADDED, "content": "<|im_start|>"}),
        m.update(eos_token={**ADDED, "content": "<|eot_id|>"}),
    ),
    "additional in both files": lambda c, m: (
        c.update(additional_special_tokens=["<|im_end|>"]),
        m.update(additional_special_tokens=["<|eot_id|>", "<|im_end|>"]),
    ),
    "extra special tokens": lambda c, m: c.update(extra_special_tokens={"image_token": "<|im_start|>"}),
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("cls", sorted(CLASS_DEFAULTS))
def test_special_tokens_map_is_transformers(tmp_path: Path, cls: str, variant: str) -> None:
    directory = build_tokenizer_dir(tmp_path / "tok", LLAMA3)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    smap = json.loads((directory / "special_tokens_map.json").read_text())
    config["tokenizer_class"] = cls + ("" if cls.endswith("Fast") else "Fast")
    VARIANTS[variant](config, smap)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "special_tokens_map.json").write_text(json.dumps(smap))
    light = read_hf_dir(str(directory))
    assert not isinstance(light, str), light
    assert light.special_tokens == _auto(directory).special_tokens_map


EXTRAS = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{{ m['role'] | upper }}: {{ m['content'] | tojson }}\n"
    "{% if m['content'] == 'stop' %}{% break %}{% endif %}"
    "{% if m['content'] == 'fail' %}{{ raise_exception('no ' ~ m['role']) }}{% endif %}"
    "{% endfor %}{{ strftime_now('%Y') }}{{ tools | tojson(indent=2) }}{{ bos_token }}"
    "{% if flag is defined %}[{{ flag }}]{% endif %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
"""A template using every extra of the chat-template environment."""
MESSAGES = [
    {"role": "system", "content": "skip me"},
    {"role": "user", "content": 'a <b> & "c" é'},
    {"role": "assistant", "content": "stop"},
    {"role": "user", "content": "never"},
]


def test_renderings_are_transformers(tmp_path: Path) -> None:
    directory = build_tokenizer_dir(tmp_path / "tok", EXTRAS)
    tok, light = _auto(directory), read_hf_dir(str(directory))
    assert not isinstance(light, str)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for kwargs in ({}, {"flag": 3}, {"bos_token": "given"}):
        for prompt in (False, True):
            for given in (None, [], tools):
                want = tok.apply_chat_template(
                    MESSAGES, tools=given, tokenize=False, add_generation_prompt=prompt, **kwargs
                )
                got = render(light, EXTRAS, MESSAGES, tools=given, add_generation_prompt=prompt,
                             kwargs=kwargs)  # fmt: skip
                assert got == want
    failing = [{"role": "user", "content": "fail"}]
    with pytest.raises(Exception, match="no user") as hf_error:
        tok.apply_chat_template(failing, tokenize=False)
    with pytest.raises(type(hf_error.value), match="no user"):
        render(light, EXTRAS, failing)


GENERATION_FIRST = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
    "{{ m['content'] }}<|eot_id|>{% endgeneration %}{% else %}{{ m['content'] }}\n"
    "{% endif %}{% endfor %}"
)
"""A generation block that can open the rendering (transformers records none there)."""


@pytest.mark.parametrize("template", [LLAMA3_GENERATION, GENERATION_FIRST])
def test_generation_masks_are_transformers(tmp_path: Path, template: str) -> None:
    directory = build_tokenizer_dir(tmp_path / "tok", template)
    tok, light = _auto(directory), read_hf_dir(str(directory))
    assert not isinstance(light, str)
    chats = [
        [{"role": "user", "content": "What is the capital?"},
         {"role": "assistant", "content": "Paris."}],
        [{"role": "assistant", "content": "Hello, how can I help?"},
         {"role": "user", "content": "Numbers: 1 2 3"},
         {"role": "assistant", "content": " the quick fox\n\n"}],
    ]  # fmt: skip
    for messages in chats:
        out = tok.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert render_generation(light, template, messages) == (
            list(out["input_ids"]),
            list(out["assistant_masks"]),
        )


@pytest.mark.parametrize("in_file", [True, False])
@pytest.mark.parametrize("in_config", [None, True, False])
def test_add_prefix_space_is_set_as_transformers_sets_it(
    tmp_path: Path, in_file: bool, in_config: bool | None
) -> None:
    """transformers rewrites the pre-tokenizer's ``add_prefix_space`` to the config's (False
    when the config does not say) on every load: ids of text and of a rendering agree."""
    directory = build_tokenizer_dir(tmp_path / "tok", LLAMA3)
    _edit(
        directory, "tokenizer.json", lambda t: t["pre_tokenizer"].update(add_prefix_space=in_file)
    )
    if in_config is not None:
        _edit(directory, "tokenizer_config.json", lambda c: c.update(add_prefix_space=in_config))
    tok, light = _auto(directory), read_hf_dir(str(directory))
    assert not isinstance(light, str), light
    for text in ("The quick fox", "x  y\n\nz"):
        assert light.tokenizer.encode(text, add_special_tokens=False).ids == tok.encode(
            text, add_special_tokens=False
        )
    conv = Conversation([{"role": "user", "content": "the fox"},
                         {"role": "assistant", "content": "jumps over"}])  # fmt: skip
    assert Encoder(str(directory)).conversation(conv).ids.tolist() == tok.apply_chat_template(
        conv.messages, tokenize=True
    )


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            lambda c: c.update(add_prefix_space=True, tokenizer_class="LlamaTokenizerFast"),
            "add_prefix_space",
        ),
        (lambda c: c.update(tokenizer_class="BertTokenizerFast"), "BertTokenizerFast"),
        (lambda c: c.update(split_special_tokens=True), "split_special_tokens"),
        (lambda c: c.update(from_slow=True), "from_slow"),
    ],
)
def test_a_directory_transformers_changes_on_load_is_loaded_by_transformers(
    tmp_path: Path, change: Any, reason: str
) -> None:
    directory = build_tokenizer_dir(tmp_path / "tok", LLAMA3)
    _edit(directory, "tokenizer_config.json", change)
    why = read_hf_dir(str(directory))
    assert isinstance(why, str) and reason in why
    if reason in ("BertTokenizerFast", "add_prefix_space", "from_slow"):
        return  # transformers rebuilds these from files this directory does not have
    encoder = Encoder(str(directory))
    assert encoder.light is None
    conv = Conversation([{"role": "user", "content": "the fox"},
                         {"role": "assistant", "content": "jumps over"}])  # fmt: skip
    got = encoder.conversation(conv)
    want = _auto(directory).apply_chat_template(conv.messages, tokenize=True)
    assert got.ids.tolist() == list(want)
    assert got.spans is not None and mask_from_spans(got.spans, got.ids.size).any()


def test_a_tool_that_is_not_a_schema_is_refused_as_transformers_refuses_it(
    tmp_path: Path,
) -> None:
    directory = build_tokenizer_dir(tmp_path / "tok", LLAMA3)
    conv = Conversation(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], tools=["f"]
    )
    with pytest.raises(ValueError, match="JSON schema"):
        _auto(directory).apply_chat_template(conv.messages, tools=conv.tools, tokenize=False)
    with pytest.raises(TemplateError, match="JSON schema"):
        Encoder(str(directory)).conversation(conv)
