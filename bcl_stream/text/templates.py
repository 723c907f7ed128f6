"""Records -> token ids and loss masks: the model's chat template, or the built-in ChatML.

Which template renders a conversation:

- a Hugging Face tokenizer directory with a ``chat_template`` (or ``--chat-template FILE``):
  that template, rendered as ``transformers`` renders it, without importing it
  (``text/hf_dir.py``; a directory ``transformers`` changes on loading goes through
  ``tokenizer.apply_chat_template`` itself). The stored ids are exactly
  ``apply_chat_template(messages, tools=tools, tokenize=True, **kwargs)``: special tokens as their ids, BOS where the template puts it.
  Message keys besides role/content (``tool_calls``, ``name``, ``reasoning_content``), the
  record's ``tools`` (an empty list too) and its ``chat_template_kwargs`` (over
  ``--chat-template-kwargs``) reach the template as given. Content given as parts that the
  template prints as a Python list is refused for the record;
- a directory without a template: conversations are refused (:class:`MissingTemplateError`,
  naming ``--chat-template FILE`` and ``--loss-on all`` with text records), as
  ``transformers`` refuses them; it renders no ChatML of its own;
- cl100k or a bare ``tokenizer.json``: the built-in plain-text ChatML of ``text/chat.py``,
  tokenized with no special tokens.

Which tokens are trained (``loss_on``, stored as ``loss_spans``):

- ``assistant`` (default): every assistant turn. A template that marks them with
  ``{% generation %}`` gives them itself (``return_assistant_tokens_mask=True``), and so does
  an official template known by its hash, through its tagged copy that renders the same text
  (``text/generation_variants.py``: Qwen3, Llama-3.1, Llama-3, Gemma-3). Otherwise each
  turn is found by rendering: the turn's text is what ``messages[:i+1]`` adds to
  ``messages[:i]`` rendered with the generation prompt (its content and end-of-turn tokens),
  located on the *full* rendering and tokenized there (a prefix tokenized on its own can split
  ``"\\n\\n"`` differently at the cut). A template that renders a turn otherwise once later
  turns follow it (Qwen3: the empty ``<think>`` block only after the last user turn) is not
  prefix-stable; its turns are located on the full rendering by rendering it again with a
  marker after the turn's content (:meth:`Encoder._located`). Either way, a conversation
  whose structure (roles, keys, tools) was seen before is located on that structure's
  skeleton, with no rendering besides the full one, where its rendering fits the skeleton
  (``text/turn_skeleton.py``). What repeats the generation
  prompt is not trained (Qwen3 without thinking puts an empty ``<think>`` block there). An
  assistant turn that opens the conversation starts where the template puts the first
  message's content. A token is trained from the one holding the turn's first character to
  the one holding its last, the rule ``transformers`` applies to ``{% generation %}`` blocks
  (so a token that also holds the next character, cl100k's ``">\\n"``, is trained). A record
  whose turn neither way locates is refused, naming the turn: use a template with
  ``{% generation %}``.
- ``last``: the final assistant turn only; ``all``: every token (no mask stored).
- prompt/response records train the response and the EOS appended after it; a TRL
  conversational prompt-completion trains its completion (all that the full rendering adds
  to the prompt rendered with the generation prompt).

A conversation left with no trained token (no assistant turn, or only empty ones) is a bad
record (``no_trained_tokens``): an error naming ``file:line`` unless ``--skip-bad``.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError
from bcl_stream.text.chat import TEMPLATE, Conversation, render_turns
from bcl_stream.text.generation_variants import generation_variant
from bcl_stream.text.hf_dir import HFDir, read_chat_template, render, render_generation
from bcl_stream.text.loss_spans import mask_from_spans, spans_from_mask, trained_count
from bcl_stream.text.token_ranges import encoding_spans, token_spans
from bcl_stream.text.tokenizers import (
    Tokenizer,
    chat_template_of,
    light_hf_dir,
    load_hf_tokenizer,
    load_tokenizer,
)
from bcl_stream.text.turn_search import MARK, changed, common_prefix, header_end, marked
from bcl_stream.text.turn_skeleton import Skeleton, Skeletons, structure

LOSS_ON = ("assistant", "last", "all")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True, slots=True)
class Encoded:
    """One record's token ids and its stored mask (None: every token trained)."""

    ids: npt.NDArray[np.uint32]
    spans: npt.NDArray[np.uint32] | None = None

    @property
    def trained(self) -> int:
        return trained_count(self.spans, int(self.ids.size))


class TemplateError(ValueError):
    """A record the template cannot render, or cannot locate turns in (the record is named by
    the caller)."""


class TokenIdError(TemplateError):
    """A record's given token ids lie outside the tokenizer's vocabulary (named by the caller)."""


class MissingTemplateError(DatasetError):
    """A Hugging Face tokenizer directory without a chat template, asked to render a
    conversation: a configuration error, not a bad record (every conversation would fail, so
    ``--skip-bad`` does not skip it). ``transformers`` refuses the same case."""


class Encoder:
    """Turns a record's layout into :class:`Encoded` under one tokenizer and ``loss_on``.

    Built once per worker process (the tokenizer loads then: a Hugging Face directory with the
    ``tokenizers`` library, tens of milliseconds; ``transformers`` only where :attr:`hf` is
    asked for); :meth:`describe` says which template renders conversations (stored in the
    cost index as ``chat_template``).
    """

    def __init__(
        self,
        tokenizer: str,
        loss_on: str = "assistant",
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if loss_on not in LOSS_ON:
            raise ValueError(f"--loss-on must be one of {LOSS_ON}, got {loss_on!r}")
        self.loss_on = loss_on
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        self.template: str | None = None
        self.template_kwargs = dict(template_kwargs or {})
        """Extra template variables for every record (a record's own take precedence)."""
        self.light: HFDir | None = None
        """The tokenizer directory read without ``transformers`` (``text/hf_dir.py``); None:
        not a directory, or one that ``transformers`` loads (:attr:`hf`)."""
        if chat_template is not None and self.tokenizer.hf_dir is None:
            raise ValueError(
                f"--chat-template {chat_template}: needs --tokenizer DIR, a Hugging Face "
                f"tokenizer directory (got {tokenizer!r}, which renders the built-in ChatML)"
            )
        if self.tokenizer.hf_dir is not None:
            light = light_hf_dir(self.tokenizer.hf_dir)
            self.light = light if isinstance(light, HFDir) else None
            self.template = (
                read_chat_template(chat_template)
                if chat_template is not None
                else chat_template_of(self.tokenizer.hf_dir)
            )
        self.mask_template: str | None = None
        """The template the masks are taken from in one rendering: the template itself when it
        has ``{% generation %}`` tags, else the tagged variant of a known official template
        (``text/generation_variants.py``, which renders the same text); None: found by
        rendering."""
        if self.template is not None:
            tagged = bool(GENERATION_TAG.search(self.template))
            self.mask_template = self.template if tagged else generation_variant(self.template)
        self.generation = self.mask_template is not None
        self.skeletons = Skeletons()
        """Where the turns of each conversation structure lie (``text/turn_skeleton.py``):
        a record whose rendering fits its structure's skeleton is located with no rendering
        of its own besides the one its ids need."""

    @functools.cached_property
    def hf(self) -> Any:
        """The directory's tokenizer through ``transformers`` (loaded on first use: prompt
        texts with the special tokens its tokenizer adds, its EOS and vocabulary, and every
        rendering of a directory :attr:`light` does not read)."""
        assert self.tokenizer.hf_dir is not None
        return load_hf_tokenizer(self.tokenizer.hf_dir)

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id appended to a response: a Hugging Face directory's as
        ``transformers`` resolves it (its config or special-tokens map), else the tokenizer's."""
        if self.tokenizer.hf_dir is not None and self.hf.eos_token_id is not None:
            return int(self.hf.eos_token_id)
        return self.tokenizer.eos_id

    def describe(self) -> str:
        """The template conversations are rendered with: the tokenizer's own, or ChatML."""
        return self.template if self.template is not None else TEMPLATE

    def conversation(self, conv: Conversation) -> Encoded:
        """Ids and mask of a conversation (:class:`TemplateError` if its template fails)."""
        if self.template is None:
            if self.tokenizer.hf_dir is not None:
                raise MissingTemplateError(
                    f"the tokenizer directory {self.tokenizer.hf_dir} has no chat_template, so "
                    "it cannot render a conversation as the model was trained; pass "
                    "--chat-template FILE (the model's Jinja template), or train text records "
                    "with --loss-on all"
                )
            return self._chatml(conv)
        return self._hf(conv)

    def turns(self, conv: Conversation) -> list[int]:
        """The assistant turns ``loss_on`` trains (all of them, or the last)."""
        turns = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
        return turns[-1:] if self.loss_on == "last" else turns

    @property
    def vocab_size(self) -> int:
        """Ids this tokenizer knows (a Hugging Face directory's added tokens included)."""
        if self.tokenizer.hf_dir is not None:
            return max(len(self.hf), self.tokenizer.vocab_size)
        return self.tokenizer.vocab_size

    def prompt_ids(self, text: str) -> npt.NDArray[np.uint32]:
        """A prompt as the model's tokenizer encodes a text (with the BOS or other tokens a
        Hugging Face directory's tokenizer adds); elsewhere with no special tokens."""
        if self.tokenizer.hf_dir is not None:
            return np.asarray(self.hf(text)["input_ids"], dtype=np.uint32)
        return self.tokenizer.ids(text)

    # -- built-in ChatML ------------------------------------------------------------------
    def _chatml(self, conv: Conversation) -> Encoded:
        text, ranges = render_turns(conv.messages)
        ids, starts = self.tokenizer.starts(text)
        if self.loss_on == "all":
            return Encoded(ids)
        if conv.completion_from is not None:  # what follows the prompt's last block
            trained = [(ranges[conv.completion_from][0], len(text))]
        else:
            trained = [ranges[i] for i in self.turns(conv)]
        return Encoded(ids, token_spans(starts, trained))

    # -- the model's chat template --------------------------------------------------------
    def _hf(self, conv: Conversation) -> Encoded:
        tagged = self.generation and conv.completion_from is None and self.loss_on != "all"
        if tagged and self.loss_on == "assistant":  # the template marks the tokens itself
            return Encoded(*self._generation_mask(conv))
        full = self._render(conv, conv.messages, False)
        if self.loss_on == "all":
            return Encoded(self._ids(full)[0])
        if not tagged:
            ids, tokens = self._ids(full)
            return Encoded(ids, _spans(tokens, self._ranges(conv, full)))
        ids, spans = self._generation_mask(conv)
        # last: the {% generation %} tokens inside the last assistant turn's rendering
        inside = mask_from_spans(_spans(self._ids(full)[1], self._ranges(conv, full)), ids.size)
        return Encoded(ids, spans_from_mask(mask_from_spans(spans, ids.size) & inside))

    def _options(self, conv: Conversation) -> dict[str, Any]:
        """What ``apply_chat_template`` gets besides the messages: the template, the record's
        tools as given, and the template variables (global, then the record's)."""
        return {**self._kwargs(conv), "chat_template": self.template, "tools": conv.tools}

    def _kwargs(self, conv: Conversation) -> dict[str, Any]:
        """The template variables of a record: the global ones, then the record's own."""
        return {**self.template_kwargs, **(conv.template_kwargs or {})}

    def _render(self, conv: Conversation, messages: list[dict[str, Any]], prompt: bool) -> str:
        try:
            if self.light is not None:
                assert self.template is not None
                text = render(
                    self.light,
                    self.template,
                    messages,
                    tools=conv.tools,
                    add_generation_prompt=prompt,
                    kwargs=self._kwargs(conv),
                )
            else:
                text = self.hf.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=prompt, **self._options(conv)
                )
        except Exception as exc:  # jinja2 errors, and whatever a template raises
            raise TemplateError(
                f"the chat template failed to render it ({type(exc).__name__}: {exc})"
            ) from exc
        _check_parts(messages, str(text))
        return str(text)

    def _generation_mask(
        self, conv: Conversation
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
        assert self.mask_template is not None
        try:
            if self.light is not None:
                input_ids, masks = render_generation(
                    self.light,
                    self.mask_template,
                    conv.messages,
                    tools=conv.tools,
                    kwargs=self._kwargs(conv),
                )
            else:
                out = self.hf.apply_chat_template(
                    conv.messages,
                    tokenize=True,
                    return_dict=True,
                    return_assistant_tokens_mask=True,
                    **{**self._options(conv), "chat_template": self.mask_template},
                )
                input_ids, masks = out["input_ids"], out["assistant_masks"]
        except Exception as exc:
            raise TemplateError(
                f"the chat template failed to render it ({type(exc).__name__}: {exc})"
            ) from exc
        if any(isinstance(m.get("content"), list) for m in conv.messages):
            _check_parts(conv.messages, self._render(conv, conv.messages, False))
        ids = np.asarray(input_ids, dtype=np.uint32)
        return ids, spans_from_mask(np.asarray(masks, dtype=bool))

    def _ids(self, text: str) -> tuple[npt.NDArray[np.uint32], Any]:
        """Ids of a rendering as ``apply_chat_template(tokenize=True)`` makes them (the text
        tokenized with no special tokens added), and what maps characters to tokens for
        :func:`_spans`: the ``tokenizers`` encoding, or each token's first character."""
        if self.light is not None:
            out = self.light.tokenizer.encode(text, add_special_tokens=False)
            return np.asarray(out.ids, dtype=np.uint32), out
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = np.asarray([a for a, _ in enc["offset_mapping"]], dtype=np.int64)
        return np.asarray(enc["input_ids"], dtype=np.uint32), starts

    def _ranges(self, conv: Conversation, full: str) -> list[tuple[int, int]]:
        """Character ranges, in the full rendering, of what is trained (see the module
        docstring): from the skeleton of the conversation's structure where the rendering fits
        it, else by rendering (:meth:`_rendered_ranges`)."""
        key = structure(conv, self._kwargs(conv))
        if key is not None:
            found = self.skeletons.ranges(conv, key, full, self._skeleton)
            if found is not None:
                return found
        return self._rendered_ranges(conv, full)

    def _skeleton(self, sentinels: Conversation) -> Skeleton | None:
        """The skeleton of a sentinel conversation: its ranges found by rendering (None where
        that refuses it: its records are then located by rendering, each refused or not on
        its own)."""
        try:
            text = self._render(sentinels, sentinels.messages, False)
            return Skeleton.of(sentinels, text, self._rendered_ranges(sentinels, text))
        except TemplateError:
            return None

    def _rendered_ranges(self, conv: Conversation, full: str) -> list[tuple[int, int]]:
        """Character ranges, in the full rendering, of what is trained (see the module
        docstring), each checked against the renderings that locate it."""
        if conv.completion_from is not None:
            prompt = self._render(conv, conv.messages[: conv.completion_from], True)
            _check_prefix(prompt, full, conv.completion_from)
            return [(len(prompt), len(full))]
        ranges = []
        for i in self.turns(conv):
            before = self._render(conv, conv.messages[:i], True) if i else self._opening(conv)
            through = self._render(conv, conv.messages[: i + 1], False)
            if through.startswith(before) and full.startswith(through):
                ranges.append((len(before), len(through)))  # prefix-stable: the common case
            else:
                ranges.append(self._located(conv, full, i, before, through))
        return ranges

    def _located(
        self, conv: Conversation, full: str, i: int, before: str, through: str
    ) -> tuple[int, int]:
        """Turn ``i``'s range in a template that renders a turn differently once later turns
        follow it (Qwen3 renders an empty ``<think>`` block only after the last user turn, so
        ``messages[:i+1]`` is no prefix of the full rendering).

        The turn's content is found by rendering twice more with a marker appended to it: the
        full rendering and ``messages[:i+1]`` each differ from their marked copy only inside
        the turn, and the copies' common suffix starts where the turn's content ends. What the
        template writes after the content (tool calls, the end-of-turn tokens) is taken from
        ``messages[:i+1]`` and must be found at that point of the full rendering. The turn
        starts after the generation prompt as far as the full rendering repeats it after
        ``messages[:i]`` (where that is a prefix of it), else after the last occurrence before
        the content of the prompt or of its longest line-ending part (earlier turns render
        otherwise in the full conversation). Any check that fails refuses the record, naming
        the turn."""
        messages = [*conv.messages[:i], marked(conv.messages[i]), *conv.messages[i + 1 :]]
        full_marked = self._render(conv, messages, False)
        through_marked = self._render(conv, messages[: i + 1], False)
        if MARK not in full_marked or MARK not in through_marked:
            _refuse_prefix(i)  # the template does not write the content as given
        first, end = changed(full, full_marked)
        _, tail_at = changed(through, through_marked)
        tail = through[tail_at:]
        if full[end : end + len(tail)] != tail:
            _refuse_prefix(i)
        bare = self._render(conv, conv.messages[:i], False) if i else None
        if bare is not None and before.startswith(bare) and full.startswith(bare):
            # the generation prompt as far as the full rendering repeats it (Qwen3 without
            # thinking adds an empty <think> block to it that only the last turn renders)
            prompt, at = before[len(bare) :], len(bare)
            start = at + common_prefix(prompt, full[at:first])
            if prompt and start == at:
                _refuse_prefix(i)
        elif full.startswith(before) and len(before) <= first:
            start = len(before)
        else:  # earlier turns render otherwise in the full conversation: the turn's header
            prompt = before[len(bare) :] if bare is not None and before.startswith(bare) else ""
            start = header_end(prompt, full, first)
            if start < 0:
                _refuse_prefix(i)
        return start, end + len(tail)

    def _opening(self, conv: Conversation) -> str:
        """What precedes the content of a conversation's first message, when that message is
        an assistant turn (no conversation before it to render: ``transformers`` refuses an
        empty one): the first message rendered alone with its content replaced by a marker,
        cut at the marker."""
        marker = "\x00bcl-content\x00"
        first = {**conv.messages[0], "content": marker}
        text = self._render(conv, [first], False)
        if marker not in text:
            raise TemplateError(
                "the chat template does not render the first message's content as given, so "
                "the assistant turn it opens cannot be located; use a template that marks "
                "assistant turns with {% generation %} (or --loss-on all)"
            )
        return text[: text.index(marker)]


def _spans(tokens: Any, ranges: list[tuple[int, int]]) -> npt.NDArray[np.uint32]:
    """The token spans of character ranges (``text/token_ranges.py``), from what
    :meth:`Encoder._ids` gives."""
    if isinstance(tokens, np.ndarray):
        return token_spans(tokens, ranges)
    return encoding_spans(tokens, ranges)


def _check_parts(messages: list[dict[str, Any]], text: str) -> None:
    """Refuse a rendering that holds a Python repr of content given as parts: the template
    expects strings and printed the list (it would be trained as such, without a word)."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not content:
            continue
        if str(content) in text or any(str(part) in text for part in content):
            raise TemplateError(
                f"messages[{i}] gives its content as a list of parts, which this chat template "
                "does not iterate (it renders the Python list); give the content as a string"
            )


def _check_prefix(prefix: str, text: str, turn: int) -> None:
    if not text.startswith(prefix):
        _refuse_prefix(turn)


def _refuse_prefix(turn: int) -> NoReturn:
    raise TemplateError(
        f"the chat template does not render the conversation prefix by prefix at message "
        f"{turn}, and the turn cannot be located on the full rendering either; use a template "
        "that marks assistant turns with {% generation %} (or --loss-on all)"
    )


def encoder_for(
    spec: str,
    loss_on: str,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> Encoder:
    """The encoder ``preprocess`` uses, one per settings and process: a record the readers or
    ``annotate`` encode is encoded exactly as ``preprocess`` writes one, and a tokenizer
    directory is loaded once, whichever kind asks first."""
    kwargs = None if template_kwargs is None else json.dumps(template_kwargs, sort_keys=True)
    return _encoder(spec, loss_on, chat_template, kwargs)


@functools.cache
def _encoder(spec: str, loss_on: str, chat_template: str | None, kwargs: str | None) -> Encoder:
    return Encoder(
        spec,
        loss_on,
        chat_template=chat_template,
        template_kwargs=None if kwargs is None else json.loads(kwargs),
    )
