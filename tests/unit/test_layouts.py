"""The layouts SFT records come in, read into a text, a conversation or a prompt/response."""

from __future__ import annotations

import pytest

from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.records.prompt_response import PromptResponse
from bcl_stream.records.registry import read_record as read_layout
from bcl_stream.records.text import Text
from bcl_stream.text.chat import Conversation

HI = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_messages_and_conversations_are_found_or_named() -> None:
    assert read_layout("f:1", {"messages": HI}, LayoutOptions()) == Conversation(HI)
    assert read_layout("f:1", {"conversations": HI}, LayoutOptions()) == Conversation(HI)
    named = LayoutOptions(messages_field="dialog")
    assert read_layout("f:1", {"dialog": HI, "text": "x"}, named) == Conversation(HI)
    bad = read_layout("f:3", {"messages": HI}, named)
    assert isinstance(bad, Bad) and bad.reason == "missing_field" and "'dialog'" in bad.message


def test_sharegpt_roles_are_mapped_and_other_keys_kept() -> None:
    record = {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "hi", "name": "ann"},
            {"from": "gpt", "value": "hello"},
            {"from": "observation", "value": "42"},
        ]
    }
    shape = read_layout("f:1", record, LayoutOptions())
    assert isinstance(shape, Conversation)
    assert shape.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "hello"},
        {"role": "tool", "content": "42"},
    ]
    bad = read_layout("f:2", {"conversations": [{"from": "robot", "value": "x"}]}, LayoutOptions())
    assert isinstance(bad, Bad) and "ShareGPT role 'robot'" in bad.message


def test_parts_tool_calls_and_tools_reach_the_template() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    shape = read_layout("f:1", {"messages": messages, "tools": tools}, LayoutOptions())
    assert shape == Conversation(messages, tools)


def test_sharegpt_function_call_becomes_tool_calls_and_tools_text_is_parsed() -> None:
    """LLaMA-Factory's glaive layout: a ``function_call`` turn holds the call's JSON, the
    record's ``tools`` the schemas' JSON text; an empty list and kwargs are kept as given."""
    record = {
        "conversations": [
            {"from": "human", "value": "weather?"},
            {"from": "function_call", "value": '{"name": "get", "arguments": {"city": "Oslo"}}'},
            {"from": "observation", "value": '{"t": 3}'},
            {"from": "gpt", "value": "3 degrees"},
        ],
        "tools": '[{"name": "get", "parameters": {}}]',
        "chat_template_kwargs": {"enable_thinking": False},
    }
    shape = read_layout("f:1", record, LayoutOptions())
    call = {"type": "function", "function": {"name": "get", "arguments": {"city": "Oslo"}}}
    assert shape == Conversation(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"t": 3}'},
            {"role": "assistant", "content": "3 degrees"},
        ],
        [{"name": "get", "parameters": {}}],
        template_kwargs={"enable_thinking": False},
    )
    empty = read_layout("f:1", {"messages": HI, "tools": []}, LayoutOptions())
    assert isinstance(empty, Conversation) and empty.tools == []
    for bad_record, match in [
        ({"conversations": [{"from": "function_call", "value": "get("}]}, "is not JSON"),
        ({"conversations": [{"from": "function_call", "value": "{}"}]}, '{"name": str'),
        ({"messages": HI, "tools": "[oops"}, "'tools' is a string that is not JSON"),
        ({"messages": HI, "tools": {"a": 1}}, "'tools' is a dict"),
        ({"messages": HI, "chat_template_kwargs": [1]}, "'chat_template_kwargs' is a list"),
    ]:
        bad = read_layout("f:4", bad_record, LayoutOptions())
        assert isinstance(bad, Bad) and match in bad.message, bad


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([["user", "hi"]], r"messages[0] is a list"),
        ([{"content": "hi"}], "needs a string 'role'"),
        ([{"role": "user"}], "has no 'content'"),
        ([{"role": "user", "content": 3}], "'content' is a int"),
        (
            [{"role": "user", "content": [{"type": "image", "url": "x"}]}],
            "not a text part ('image')",
        ),
    ],
)
def test_malformed_messages_name_the_message(messages: object, match: str) -> None:
    bad = read_layout("data.jsonl:5", {"messages": messages}, LayoutOptions())
    assert isinstance(bad, Bad)
    assert (bad.source, bad.reason) == ("data.jsonl:5", "bad_messages")
    assert match in bad.message


def test_prompt_response_and_prompt_completion() -> None:
    assert read_layout("f:1", {"prompt": "p", "response": "r"}, LayoutOptions()) == PromptResponse(
        "p", "r"
    )
    assert read_layout(
        "f:1", {"prompt": "p", "completion": "c"}, LayoutOptions()
    ) == PromptResponse("p", "c", ("prompt", "completion"))
    assert read_layout("f:1", {"prompt": [1, 2], "response": [3]}, LayoutOptions()) == (
        PromptResponse([1, 2], [3])
    )
    mixed = read_layout("f:2", {"prompt": "p", "response": [3]}, LayoutOptions())
    assert isinstance(mixed, Bad) and "both be text or both ids" in mixed.message
    wrong = read_layout("f:2", {"prompt": 5, "response": "r"}, LayoutOptions())
    assert isinstance(wrong, Bad) and "field 'prompt' is a int" in wrong.message
    for empty in ("", []):  # nothing to train but the EOS: refused, as an empty completion is
        bad = read_layout("f:3", {"prompt": "p" if empty == "" else [1], "completion": empty},
                          LayoutOptions())  # fmt: skip
        assert isinstance(bad, Bad) and bad.reason == "no_trained_tokens"
        assert "the 'completion' is empty" in bad.message


def test_a_text_field_wins_and_a_record_without_any_layout_is_named() -> None:
    both = {"text": "plain", "messages": HI}
    assert read_layout("f:1", both, LayoutOptions()) == Text("plain")
    bad = read_layout("f:7", {"body": "x"}, LayoutOptions())
    assert isinstance(bad, Bad) and bad.reason == "missing_field"
    assert "no 'text' field, no messages" in bad.message and "--messages-field" in bad.message


def test_layout_fields_is_the_order_read_layout_follows() -> None:
    from bcl_stream.records.kind import Fields
    from bcl_stream.records.registry import detect as layout_fields

    plain = LayoutOptions()
    assert layout_fields(["text", "messages"], plain) == Fields("text", ("text",))
    assert layout_fields(["conversations", "prompt"], plain) == Fields(
        "messages", ("conversations",)
    )
    assert layout_fields(["prompt", "completion"], plain) == Fields(
        "prompt_response", ("prompt", "completion")
    )
    assert layout_fields(["prompt", "answer"], plain) is None
    named = LayoutOptions(messages_field="dialog")
    assert layout_fields(["text", "dialog"], named) == Fields("messages", ("dialog",))
    assert layout_fields(["prompt", "response"], named) is None
