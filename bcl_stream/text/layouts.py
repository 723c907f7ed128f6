"""The layouts SFT records come in, read into one of three shapes (worker side).

- :class:`Text`: a text field (``--text-field``, default ``text``): pretraining-style, every
  token trained.
- :class:`Conversation`: a list of messages under ``messages`` or ``conversations`` (or the
  field ``--messages-field`` names). Messages are ``{"role", "content", ...}`` (OpenAI / Hugging
  Face) or ShareGPT's ``{"from", "value"}`` with roles ``human``/``gpt``/``system`` (also
  ``tool``, ``function``, ``observation``) mapped to ``user``/``assistant``/``system``/``tool``;
  a ShareGPT ``function_call`` turn (its value the call's JSON) is an assistant turn with that
  call as its ``tool_calls``. ``content`` may be a string, a list of parts (``{"type": "text",
  "text": ...}``), or null beside ``tool_calls``. Every other key of a message (``tool_calls``,
  ``name``, ...), a record's top-level ``tools`` (an empty list too; JSON text, as
  LLaMA-Factory stores it, is parsed) and its ``chat_template_kwargs`` are kept and handed to
  the chat template, never dropped.
- :class:`PromptResponse`: llm-foundry's finetuning layout (``prompt`` + ``response``) or TRL's
  prompt-completion (``prompt`` + ``completion``), each text or token ids (an empty response
  is refused: it would train only the EOS); a TRL
  *conversational* prompt-completion (both lists of messages) is a :class:`Conversation` whose
  completion is what is trained.

Which one a record is (:func:`layout_fields`, from its field names alone): its text field if
present (as before), else its messages field, else prompt/response, else it is refused naming
the fields it has. ``annotate`` decides an existing dataset's layout from its column names
with the same function, so the two recognise the same layouts. Malformed values are a
:class:`Bad` that names the message and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Bad:
    """A record that could not be turned into text: why (a report key) and a message."""

    source: str
    reason: str
    message: str


MESSAGES_FIELDS = ("messages", "conversations")
"""Where a conversation is looked for when ``--messages-field`` is not given."""
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_call": "assistant",
}
"""ShareGPT ``from`` values -> chat-template roles (``function_call``: an assistant turn whose
``value`` is the call's JSON ``{"name", "arguments"}``, given to the template as its
``tool_calls``; ``observation``: the tool's answer)."""
RESPONSE_FIELDS = ("response", "completion")
"""llm-foundry's and TRL's names for what follows the prompt."""


@dataclass(frozen=True, slots=True)
class LayoutOptions:
    """Where a record's content is (picklable: sent to each worker)."""

    text_field: str = "text"
    messages_field: str | None = None
    """None: ``messages`` or ``conversations``."""


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Conversation:
    messages: list[dict[str, Any]]
    """Normalized: every message has a string ``role`` and its other keys as given."""
    tools: list[Any] | None = None
    """The record's ``tools`` as given (an empty list too: templates render ``[]`` otherwise
    than no tools); None: the record has none."""
    completion_from: int | None = None
    """TRL conversational prompt-completion: messages from this index on are the completion
    (what is trained); None: a conversation whose assistant turns are trained."""
    template_kwargs: dict[str, Any] | None = None
    """The record's ``chat_template_kwargs`` (TRL's and verl's key: ``enable_thinking``,
    ``date_string``, ...), given to the template as extra variables."""


@dataclass(frozen=True, slots=True)
class PromptResponse:
    prompt: str | list[int]
    response: str | list[int]
    fields: tuple[str, str] = field(default=("prompt", "response"))


RecordLayout = Text | Conversation | PromptResponse


def message_text(message: dict[str, Any]) -> str:
    """The text of a message's ``content`` (parts joined; null: empty)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)


def trains_something(message: dict[str, Any]) -> bool:
    """Whether an assistant message has something to train: text content or tool calls."""
    return bool(message_text(message)) or bool(message.get("tool_calls"))


def _message(i: int, message: Any, where: str) -> dict[str, Any] | str:
    """A normalized message, or what is wrong with it."""
    if not isinstance(message, dict):
        return f"{where}[{i}] is a {type(message).__name__}, expected an object"
    if "role" not in message and "from" in message:  # ShareGPT
        spoken = message.get("from")
        role = SHAREGPT_ROLES.get(spoken.lower()) if isinstance(spoken, str) else None
        if role is None:
            return (
                f"{where}[{i}] has ShareGPT role {spoken!r}; known roles: {sorted(SHAREGPT_ROLES)}"
            )
        rest = {k: v for k, v in message.items() if k not in ("from", "value")}
        if isinstance(spoken, str) and spoken.lower() == "function_call":
            call = _function_call(message.get("value"))
            if isinstance(call, str):
                return f"{where}[{i}] (ShareGPT function_call) {call}"
            rest = {**rest, "tool_calls": [{"type": "function", "function": call}]}
            message = {"role": role, "content": "", **rest}
        else:
            message = {"role": role, "content": message.get("value"), **rest}
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        return f"{where}[{i}] needs a string 'role' (or ShareGPT 'from'), got {type(role).__name__}"
    if content is None and not message.get("tool_calls"):
        return f"{where}[{i}] ({role}) has no 'content' (null is allowed only beside tool_calls)"
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, str):
                continue
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                return (
                    f"{where}[{i}].content[{j}] is not a text part ({kind!r}); only "
                    "{'type': 'text', 'text': ...} parts are supported"
                )
    elif content is not None and not isinstance(content, str):
        return (
            f"{where}[{i}] ({role}) 'content' is a {type(content).__name__}, expected a "
            "string or a list of text parts"
        )
    return message


def _function_call(value: Any) -> dict[str, Any] | str:
    """A ShareGPT ``function_call`` value (the call's JSON text, or the object) as
    ``{"name", "arguments"}``, or what is wrong with it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return (
                f'is not JSON ({exc.msg} at column {exc.colno}); expected {{"name", "arguments"}}'
            )
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'needs {"name": str, "arguments": ...} as its value'
    return {"name": value["name"], "arguments": value.get("arguments", {})}


def _messages(value: Any, where: str) -> list[dict[str, Any]] | str:
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else f"a {type(value).__name__}"
        return f"{where!r} must be a non-empty list of messages, got {got}"
    out = []
    for i, raw in enumerate(value):
        message = _message(i, raw, where)
        if isinstance(message, str):
            return message
        out.append(message)
    return out


ID_LIMIT = 2**32
"""Token ids are stored as ``uint32``: an id at or above this cannot be written."""


def _text_or_ids(value: Any, name: str) -> str | list[int] | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(type(v) is int and 0 <= v < ID_LIMIT for v in value):
        return list(value)
    return None


def _bad_ids(value: Any, name: str) -> str | None:
    """Why a list that is meant to hold token ids does not (a boolean, a negative id, or one
    past the ``uint32`` the ids are stored as, with its position), or None."""
    if not isinstance(value, list):
        return None
    for i, v in enumerate(value):
        if isinstance(v, bool):
            return f"field {name!r} holds a boolean ({v}) at position {i}, not a token id"
        if isinstance(v, int) and not 0 <= v < ID_LIMIT:
            return (
                f"field {name!r} holds token id {v} at position {i}, outside [0, {ID_LIMIT}) "
                "(ids are stored as uint32; no vocabulary is that large)"
            )
    return None


@dataclass(frozen=True, slots=True)
class Fields:
    """Which layout a record's field names make, and the fields it is read from."""

    kind: Literal["text", "messages", "prompt_response"]
    names: tuple[str, ...]
    """text: (the text field,); messages: (the messages field,); prompt_response: (``prompt``,
    ``response`` or ``completion``)."""


def layout_fields(names: Collection[str], options: LayoutOptions) -> Fields | None:
    """The layout a record with fields ``names`` is read as (the module docstring's order), or
    None: none. The one decision ``preprocess`` (per record) and ``annotate`` (per dataset,
    from its columns) share."""
    if options.text_field in names and options.messages_field is None:
        return Fields("text", (options.text_field,))
    for name in (options.messages_field,) if options.messages_field else MESSAGES_FIELDS:
        if name in names:
            return Fields("messages", (name,))
    if options.messages_field is None and "prompt" in names:
        second = next((r for r in RESPONSE_FIELDS if r in names), None)
        if second is not None:
            return Fields("prompt_response", ("prompt", second))
    return None


def read_layout(source: str, record: dict[str, Any], options: LayoutOptions) -> RecordLayout | Bad:
    """The layout of one parsed record (see the module docstring), or why it has none."""
    found = layout_fields(record, options)
    if found is not None and found.kind == "text":
        text = record[options.text_field]
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                return Bad(
                    source,
                    "undecodable",
                    f"field {options.text_field!r} is not valid UTF-8 ({exc})",
                )
        if not isinstance(text, str):
            return Bad(
                source,
                "bad_field",
                f"field {options.text_field!r} is a {type(text).__name__}, expected a string",
            )
        return Text(text)
    if found is not None and found.kind == "messages":
        name = found.names[0]
        messages = _messages(record[name], name)
        if isinstance(messages, str):
            return Bad(source, "bad_messages", messages)
        extra = _tools_and_kwargs(record)
        if isinstance(extra, str):
            return Bad(source, "bad_field", extra)
        return Conversation(messages, extra[0], template_kwargs=extra[1])
    if found is not None:
        return _prompt_response(source, record, found.names[1])
    if options.messages_field is not None:
        return Bad(
            source,
            "missing_field",
            f"no {options.messages_field!r} field (--messages-field; fields: {sorted(record)[:8]})",
        )
    return Bad(
        source,
        "missing_field",
        f"no {options.text_field!r} field, no messages ({' or '.join(MESSAGES_FIELDS)}) and no "
        f"prompt/response (fields: {sorted(record)[:8]}); pass --text-field NAME or "
        "--messages-field NAME",
    )


KWARGS_FIELD = "chat_template_kwargs"
"""A record's extra template variables (TRL's and verl's name for them)."""


def _tools_and_kwargs(
    record: dict[str, Any],
) -> tuple[list[Any] | None, dict[str, Any] | None] | str:
    """A record's ``tools`` (a list as given, an empty one too; LLaMA-Factory's JSON text of
    one is parsed; absent or null: None) and its ``chat_template_kwargs``, or what is wrong."""
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as exc:
            return f"'tools' is a string that is not JSON ({exc.msg} at column {exc.colno})"
    if tools is not None and not isinstance(tools, list):
        return f"'tools' is a {type(tools).__name__}, expected a list of tool schemas"
    kwargs = record.get(KWARGS_FIELD)
    if kwargs is not None and not isinstance(kwargs, dict):
        return f"{KWARGS_FIELD!r} is a {type(kwargs).__name__}, expected an object"
    return tools, kwargs


def _prompt_response(source: str, record: dict[str, Any], second: str) -> RecordLayout | Bad:
    prompt, response = record["prompt"], record[second]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        first = _messages(prompt, "prompt")
        rest = _messages(response, second)
        if isinstance(first, str) or isinstance(rest, str):
            return Bad(source, "bad_messages", first if isinstance(first, str) else str(rest))
        extra = _tools_and_kwargs(record)
        if isinstance(extra, str):
            return Bad(source, "bad_field", extra)
        return Conversation(first + rest, extra[0], len(first), extra[1])
    p, r = _text_or_ids(prompt, "prompt"), _text_or_ids(response, second)
    for name, value, got in (("prompt", prompt, p), (second, response, r)):
        bad_ids = _bad_ids(value, name) if got is None else None
        if bad_ids is not None:
            return Bad(source, "bad_token_id", bad_ids)
        if got is None:
            return Bad(
                source,
                "bad_field",
                f"field {name!r} is a {type(value).__name__}, expected text or a list of token ids",
            )
    assert p is not None and r is not None
    if type(p) is not type(r):
        return Bad(source, "bad_field", f"'prompt' and {second!r} must both be text or both ids")
    if not r:
        return Bad(
            source,
            "no_trained_tokens",
            f"the {second!r} is empty: nothing to train but the EOS; fill it in or drop the "
            "record (--skip-bad skips and counts such records)",
        )
    return PromptResponse(p, r, ("prompt", second))
