"""The chat template: how a ``messages`` record becomes the text we tokenize.

ChatML-style, one block per message, rendered as plain text and tokenized with no special
tokens (so the same string gives the same count under any tokenizer)::

    <|im_start|>{role}\n{content}<|im_end|>\n

Why plain text: cl100k has no ``<|im_start|>`` special token, and the cost index needs a
count that is reproducible from the stored ids alone. A trainer that wants real special
tokens re-renders from the source; the count differs by a few tokens per message, which is
well inside what a cost model can tell apart.
"""

from __future__ import annotations

from typing import Any

TEMPLATE = "<|im_start|>{role}\n{content}<|im_end|>\n"
"""The per-message template (documented in docs/preprocessing.md)."""


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
