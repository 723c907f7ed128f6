"""The built-in chat template: how a conversation becomes the text we tokenize when the
tokenizer brings no chat template of its own (cl100k, a bare ``tokenizer.json``). A tokenizer
directory with a ``chat_template`` is rendered by that template instead
(``text/templates.py``).

ChatML-style, one block per message, rendered as plain text and tokenized with no special
tokens (so the same string gives the same count under any tokenizer)::

    <|im_start|>{role}\n{content}<|im_end|>\n

``content`` given as a list of text parts is their concatenation; each of a message's
``tool_calls`` follows its content as ``\n<tool_call>\n{JSON}\n</tool_call>`` (the form
Qwen2.5's template uses). The trained part of an assistant turn (:func:`render_turns`) is its
content, its tool calls and the ``<|im_end|>`` marker text, not the ``\n`` after it.

Why plain text: cl100k has no ``<|im_start|>`` special token, and the cost index needs a
count that is reproducible from the stored ids alone. A trainer that wants real special
tokens re-renders from the source; the count differs by a few tokens per message, which is
well inside what a cost model can tell apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TEMPLATE = "<|im_start|>{role}\n{content}<|im_end|>\n"
"""The per-message template (documented in docs/preprocessing.md)."""
END = "<|im_end|>"
TOOL_CALL = "\n<tool_call>\n{call}\n</tool_call>"


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


class ChatFormatError(ValueError):
    """A ``messages`` value that is not a list of {role: str, content: str} objects."""


def render_messages(messages: Any) -> str:
    """The text of a conversation under :data:`TEMPLATE`; :class:`ChatFormatError` if malformed."""
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError(
            f"'messages' must be a non-empty list, got {type(messages).__name__}"
            + (" (empty)" if isinstance(messages, list) else "")
        )
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatFormatError(
                f"messages[{i}] is a {type(message).__name__}, expected an object"
            )
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ChatFormatError(
                f"messages[{i}] needs string 'role' and 'content', got "
                f"role={type(role).__name__}, content={type(content).__name__}"
            )
        parts.append(TEMPLATE.format(role=role, content=content))
    return "".join(parts)


def render_turns(messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The text of normalized messages (``records/chat.py``) under :data:`TEMPLATE`,
    and for each message the character range ``[start, end)`` of its content, tool calls and
    ``<|im_end|>`` (what an assistant turn trains). Equal to :func:`render_messages` for
    string contents without tool calls."""
    pieces: list[str] = []
    ranges: list[tuple[int, int]] = []
    position = 0
    for message in messages:
        head = f"<|im_start|>{message['role']}\n"
        calls = message.get("tool_calls") or []
        body = message_text(message) + "".join(
            TOOL_CALL.format(call=json.dumps(call, ensure_ascii=False)) for call in calls
        )
        start = position + len(head)
        ranges.append((start, start + len(body) + len(END)))
        piece = head + body + END + "\n"
        pieces.append(piece)
        position += len(piece)
    return "".join(pieces), ranges
