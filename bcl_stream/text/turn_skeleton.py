"""Assistant turns located on one rendering: the conversation's *skeleton*.

Why: finding the trained turns by rendering (``text/templates.py``) renders each turn's
prefixes, and a template that is not prefix-stable renders the conversation again with a
marker in each turn: 2 to 5 renderings per assistant turn on top of the one that gives the ids
(1.45x and 2.45x a bare ``apply_chat_template`` loop). Yet where the turns lie depends, for
almost every template, only on the conversation's *structure* (its roles, the message keys
besides the content, the tools and the template variables), not on the content's text.

So a conversation's turns are located once per structure, on its skeleton: the same
conversation with every non-empty string content replaced by a sentinel (:data:`SENTINEL`,
unique per message), whose ranges are found by the same rendering method and stored as
positions in the text between sentinels (its *glue*). A record of that structure then costs
one rendering, the one its ids need, and a string check: the rendering must be exactly the
skeleton's glue with each sentinel replaced by its message's content. That check is the proof
the skeleton applies: the template wrote each content as given, where the sentinel stood, and
everything else as it wrote it for the sentinels; so each turn lies where it lay in the
skeleton. (What the check does not see are the renderings of the turn's prefixes, which
define its range: a template whose prefixes would depend on a content's text in a way its
full rendering does not show would escape it. None of the templates tested does.) A record
that fails it (a template that trims, splits or tests the content: Qwen3's
``</think>`` parsing, Llama-3's ``| trim``) is located by rendering, as before; so is a
structure seen for the first time (:attr:`Skeletons.after`: a structure seen once, such as a
record with its own tool calls, would pay for a skeleton it never reuses), one with content
given as parts, and one whose skeleton's ranges start or end inside a sentinel.

``tests/unit/test_official_templates.py`` checks the masks located this way against
``return_assistant_tokens_mask`` on the official Qwen3, Llama-3.1, Llama-3 and Gemma-3
templates and public multi-turn data; ``tools/bench_sft_preprocess.py`` measures the cost.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from bcl_stream.text.chat import Conversation

SENTINEL = "\x02bcl-content-{}\x03"
"""Stands for message ``i``'s content in a skeleton (control characters no template trims,
and whose ends differ from ``turn_search.MARK``'s, so a turn located by its marker ends where
the sentinel ends)."""
_SENTINEL = re.compile("\x02bcl-content-(\\d+)\x03")


def _slot(message: dict[str, Any]) -> bool:
    """Whether a message's content stands as a sentinel in the skeleton (a non-empty string;
    an empty or missing content is part of the structure: templates test it)."""
    content = message.get("content")
    return isinstance(content, str) and content != ""


def structure(conv: Conversation, kwargs: dict[str, Any]) -> Hashable | None:
    """What a conversation's skeleton depends on (``kwargs``: its template variables); None:
    no skeleton (content given as parts, or keys that are not JSON)."""
    shape = []
    for message in conv.messages:
        content = message.get("content")
        if not (content is None or isinstance(content, str)):
            return None
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        try:
            keys = json.dumps(extra, sort_keys=True) if extra else ""
        except (TypeError, ValueError):
            return None
        slot = _slot(message)
        shape.append((message["role"], slot, None if slot else content, keys))
    try:
        outer = json.dumps([conv.tools, kwargs], sort_keys=True)
    except (TypeError, ValueError):
        return None
    return tuple(shape), outer, conv.completion_from


def sentinel_conversation(conv: Conversation) -> Conversation:
    """``conv`` with each non-empty string content replaced by its :data:`SENTINEL`."""
    messages = [
        {**m, "content": SENTINEL.format(i)} if _slot(m) else m for i, m in enumerate(conv.messages)
    ]
    return dataclasses.replace(conv, messages=messages)


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A rendering of a sentinel conversation, cut at its sentinels, and the trained ranges
    found on it, as positions in its glue."""

    glue: tuple[str, ...]
    """The text between sentinels (one more piece than :attr:`slots`)."""
    slots: tuple[int, ...]
    """The message whose content each sentinel stands for, in order of appearance."""
    bounds: tuple[tuple[int, int], ...]
    """Each range's start and end: (glue piece, offset in it)."""

    @classmethod
    def of(cls, conv: Conversation, text: str, ranges: list[tuple[int, int]]) -> Skeleton | None:
        """The skeleton of ``text``, the rendering of the sentinel conversation ``conv``, with
        its ``ranges``; None if a range starts or ends inside a sentinel."""
        parts = _SENTINEL.split(text)
        glue, slots = tuple(parts[0::2]), tuple(int(i) for i in parts[1::2])
        messages = conv.messages
        if any(i >= len(messages) or messages[i]["content"] != SENTINEL.format(i) for i in slots):
            return None  # a sentinel's text written by something else than its message
        starts, position = [], 0
        for piece, i in zip(glue, (*slots, None), strict=True):
            starts.append(position)
            position += len(piece) + (0 if i is None else len(SENTINEL.format(i)))
        bounds = []
        for point in (p for r in ranges for p in r):
            piece = bisect.bisect_right(starts, point) - 1
            offset = point - starts[piece]
            if offset > len(glue[piece]):
                return None
            bounds.append((piece, offset))
        return cls(glue, slots, tuple(bounds))

    def locate(self, conv: Conversation, full: str) -> list[tuple[int, int]] | None:
        """The trained ranges of ``conv`` in ``full``, its rendering; None unless ``full`` is
        exactly the glue with each sentinel replaced by its message's content."""
        messages = conv.messages
        pieces, starts, position = [], [], 0
        for piece, i in zip(self.glue, (*self.slots, None), strict=True):
            starts.append(position)
            pieces.append(piece)
            position += len(piece)
            if i is not None:
                content = messages[i]["content"]
                if not isinstance(content, str):
                    return None
                pieces.append(content)
                position += len(content)
        if position != len(full) or "".join(pieces) != full:
            return None
        points = [starts[piece] + offset for piece, offset in self.bounds]
        return list(zip(points[0::2], points[1::2], strict=True))


class Skeletons:
    """The skeletons of one encoder's conversations, by :func:`structure`.

    A structure's skeleton is built the :attr:`after`-th time it is seen (before, its records
    are located by rendering). At most :attr:`limit` structures are kept (the cache is emptied
    when full: a corpus of unique structures costs no memory).
    """

    def __init__(self, after: int = 2, limit: int = 4096) -> None:
        self.after = after
        self.limit = limit
        self.located = 0
        """Records whose turns a skeleton located."""
        self._seen: dict[Hashable, int] = {}
        self._built: dict[Hashable, Skeleton | None] = {}

    def ranges(
        self,
        conv: Conversation,
        key: Hashable,
        full: str,
        build: Callable[[Conversation], Skeleton | None],
    ) -> list[tuple[int, int]] | None:
        """The trained ranges of ``conv`` (rendered as ``full``) by its structure's skeleton,
        built by ``build(sentinel conversation)`` when due; None: locate it by rendering."""
        if key in self._built:
            skeleton = self._built[key]
        else:
            seen = self._seen.get(key, 0) + 1
            if seen < self.after:
                if len(self._seen) >= self.limit:
                    self._seen.clear()
                self._seen[key] = seen
                return None
            self._seen.pop(key, None)
            if len(self._built) >= self.limit:
                self._built.clear()
            skeleton = self._built[key] = build(sentinel_conversation(conv))
        found = None if skeleton is None else skeleton.locate(conv, full)
        self.located += found is not None
        return found
