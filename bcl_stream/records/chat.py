"""The conversation kind: a list of messages rendered with the model's chat template.

A record is a conversation when it has a list of messages under ``messages`` or
``conversations`` (or the field ``--messages-field`` / ``messages_field`` names). Messages are
``{"role", "content", ...}`` (OpenAI / Hugging Face) or ShareGPT's ``{"from", "value"}`` with
roles ``human``/``gpt``/``system`` (also ``tool``, ``function``, ``observation``) mapped to
``user``/``assistant``/``system``/``tool``; a ShareGPT ``function_call`` turn (its value the
call's JSON) is an assistant turn with that call as its ``tool_calls``. ``content`` may be a
string, a list of parts (``{"type": "text", "text": ...}``), or null beside ``tool_calls``.
Every other key of a message (``tool_calls``, ``name``, ...), a record's top-level ``tools``
(an empty list too; JSON text, as LLaMA-Factory stores it, is parsed) and its
``chat_template_kwargs`` are kept and handed to the chat template, never dropped.

Encoding (the template, the built-in ChatML, the mask by ``loss_on``) is the encoder's
(``text/templates.py``); this module decides what a conversation is, refuses one that would
train nothing, and reads a stored conversation column (``annotate``, the readers) as
``preprocess`` encodes one. Its knobs: ``messages_field``, ``tokenizer``, ``loss_on``,
``chat_template``, ``chat_template_kwargs``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.records.kind import (
    Bad,
    Encoders,
    FoundColumns,
    Ids,
    LayoutOptions,
    encode_checked,
    needs_tokenizer,
)
from bcl_stream.records.source import RecordSource
from bcl_stream.text.chat import Conversation, trains_something
from bcl_stream.text.templates import Encoded, Encoder

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


def read_messages(value: Any, where: str) -> list[dict[str, Any]] | str:
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


KWARGS_FIELD = "chat_template_kwargs"
"""A record's extra template variables (TRL's and verl's name for them)."""


def tools_and_kwargs(
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


class ChatKind:
    """A conversation (the module docstring)."""

    name = "messages"
    shape: type = Conversation
    what = "a conversation column"
    knobs: tuple[str, ...] = (
        "messages_field",
        "tokenizer",
        "loss_on",
        "chat_template",
        "chat_template_kwargs",
    )

    def detect(self, names: Collection[str], options: LayoutOptions) -> tuple[str, ...] | None:
        for name in (options.messages_field,) if options.messages_field else MESSAGES_FIELDS:
            if name in names:
                return (name,)
        return None

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        name = fields[0]
        messages = read_messages(record[name], name)
        if isinstance(messages, str):
            return Bad(where, "bad_messages", messages)
        extra = tools_and_kwargs(record)
        if isinstance(extra, str):
            return Bad(where, "bad_field", extra)
        return Conversation(messages, extra[0], template_kwargs=extra[1])

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        if encoder.loss_on != "all":
            bad = _nothing_trained(where, shape, encoder)
            if bad is not None:
                return bad
        return encoder.conversation(shape)

    def declared(self, found: FoundColumns) -> RecordSource:
        spec = needs_tokenizer(self, found)
        return RecordSource(messages_field=found.fields[0], tokenizer=spec, loss_on=found.loss_on)

    def reads(self, source: RecordSource) -> bool:
        return source.messages_field is not None

    def stored(
        self, values: Sequence[Any], source: RecordSource, where: str, encoders: Encoders
    ) -> Ids:
        """A stored conversation (a list of messages, or its JSON text), rendered and masked
        exactly as ``preprocess`` does."""
        value = values[0]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise DatasetError(
                    f"{where}: {source.describe()}: the column holds text that is not a JSON "
                    f"list of messages ({exc})"
                ) from exc
        shape = self.read(where, {source.field: value}, (source.field,))
        encoder = encoders(
            str(source.tokenizer),
            source.loss_on or "assistant",
            source.chat_template,
            source.chat_template_kwargs,
        )
        encoded = shape if isinstance(shape, Bad) else encode_checked(self, where, shape, encoder)
        if isinstance(encoded, Bad):
            raise DatasetError(
                f"{where}: {encoded.message}. A record cannot be left out of a dataset in "
                "place: preprocess its source (with --skip-bad), or read it with loss_on all"
            )
        return encoded.ids, encoded.spans


def _nothing_trained(source: str, conv: Conversation, encoder: Encoder) -> Bad | None:
    """A conversation whose trained turns are absent or empty (point of the outlier policy:
    an error naming the record, or skipped under --skip-bad); None: it trains something."""
    if conv.completion_from is not None:
        turns = list(range(conv.completion_from, len(conv.messages)))
    else:
        turns = encoder.turns(conv)
    if any(trains_something(conv.messages[i]) for i in turns):
        return None
    roles = ", ".join(m["role"] for m in conv.messages)
    if conv.completion_from is not None:
        what = "an empty completion"
    elif not turns:
        what = "no assistant turn"
    elif encoder.loss_on == "last":
        what = "an empty last assistant turn"
    else:
        what = "only empty assistant turns"
    return Bad(
        source,
        "no_trained_tokens",
        f"the conversation has {what} (roles: {roles}): no token to train under --loss-on "
        f"{encoder.loss_on}",
    )


CHAT = ChatKind()
