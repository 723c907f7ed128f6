"""Assistant turns located on the skeleton of a conversation's structure
(``text/turn_skeleton.py``): the masks are those found by rendering each record's prefixes,
and those of ``return_assistant_tokens_mask`` under the template's ``{% generation %}`` copy;
a record whose rendering does not fit the skeleton (a template that trims or tests its
content) is located by rendering, with the same result. The official templates on public
multi-turn data are checked the same way in ``test_official_templates.py``."""

from __future__ import annotations

from typing import Any

import pytest

from bcl_stream.records.registry import encode
from bcl_stream.text.chat import Conversation
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.templates import Encoder
from bcl_stream.text.tokenizers import load_hf_tokenizer
from tests.hf_tokenizers import CHATML, LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir
from tests.sft_records import word_chats

TRIMMED = LLAMA3.replace("{{ message['content'] }}", "{{ message['content'] | trim }}")
BRANCHING = LLAMA3.replace(
    "{{ message['content'] }}",
    "{% if 'flag' in message['content'] %}[flagged] {% endif %}{{ message['content'] }}",
)


def masks(encoder: Encoder, conversations: list[list[dict[str, Any]]]) -> list[list[int]]:
    out = []
    for messages in conversations:
        got = encode(Conversation(messages), encoder)
        assert got.spans is not None
        out.append(mask_from_spans(got.spans, got.ids.size).astype(int).tolist())
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("skeleton")
    templates = {"llama3": LLAMA3, "chatml": CHATML, "trimmed": TRIMMED, "branching": BRANCHING}
    return {name: str(build_tokenizer_dir(root / name, t)) for name, t in templates.items()}


@pytest.mark.parametrize("name", ["llama3", "chatml"])
def test_masks_on_the_skeleton_are_those_found_by_rendering(
    dirs: dict[str, str], name: str
) -> None:
    conversations = word_chats(40)
    by_rendering = Encoder(dirs[name])
    by_rendering.skeletons.after = 10**9  # never built: each record's prefixes rendered
    on_skeleton = Encoder(dirs[name])
    assert masks(on_skeleton, conversations) == masks(by_rendering, conversations)
    # three structures, each located by rendering the first time it is seen
    assert on_skeleton.skeletons.located == 40 - 3
    assert by_rendering.skeletons.located == 0


def test_masks_on_the_skeleton_are_return_assistant_tokens_mask(dirs: dict[str, str]) -> None:
    """The test template's {% generation %} copy marks what the rendering method trains."""
    conversations = word_chats(25, seed=1)
    encoder = Encoder(dirs["llama3"])
    encoder.skeletons.after = 1
    tok = load_hf_tokenizer(dirs["llama3"])
    for messages, mask in zip(conversations, masks(encoder, conversations), strict=True):
        oracle = tok.apply_chat_template(
            messages, chat_template=LLAMA3_GENERATION, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
        assert mask == list(oracle["assistant_masks"])
    assert encoder.skeletons.located == 25


@pytest.mark.parametrize(
    ("name", "odd"), [("trimmed", " padded with spaces "), ("branching", "a flag here")]
)
def test_a_rendering_that_does_not_fit_the_skeleton_is_located_by_rendering(
    dirs: dict[str, str], name: str, odd: str
) -> None:
    """A template that trims or tests the content writes such a record otherwise than the
    skeleton's sentinels: the string check sends it to the rendering method."""
    conversations = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"answer {i}"}]
        for i in range(4)
    ]
    conversations[2][1]["content"] = odd
    by_rendering = Encoder(dirs[name])
    by_rendering.skeletons.after = 10**9
    on_skeleton = Encoder(dirs[name])
    on_skeleton.skeletons.after = 1
    got = masks(on_skeleton, conversations)
    assert got == masks(by_rendering, conversations)
    assert on_skeleton.skeletons.located == 3  # all but the odd one
    ids = encode(Conversation(conversations[2]), on_skeleton).ids
    assert sum(got[2]) > 0 and len(got[2]) == ids.size


def test_a_missing_content_is_another_structure_than_a_text(dirs: dict[str, str]) -> None:
    """A message whose content is null renders otherwise than one with text (ChatML writes
    "None"): the two records have different skeletons, each fitting its own."""
    with_text = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "yes"}]  # fmt: skip
    without = [{**with_text[0], "content": None}, *with_text[1:]]
    by_rendering = Encoder(dirs["chatml"])
    by_rendering.skeletons.after = 10**9
    on_skeleton = Encoder(dirs["chatml"])
    on_skeleton.skeletons.after = 1
    conversations = [with_text, without, with_text, without]
    assert masks(on_skeleton, conversations) == masks(by_rendering, conversations)
    assert on_skeleton.skeletons.located == 4
