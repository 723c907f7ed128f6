"""The prompt/response kind: llm-foundry's finetuning layout (``prompt`` + ``response``) or
TRL's prompt-completion (``prompt`` + ``completion``), each text or token ids.

A record is prompt/response when it has ``prompt`` and ``response`` (or ``completion``) and no
messages field is named. Its ids are the prompt's, then the response's, then the tokenizer's
EOS (unless the response already ends with it); the response and its EOS are trained (all of
it under ``loss_on all``). An empty response is refused: it would train only the EOS. A TRL
*conversational* prompt-completion (both lists of messages) is read as a
:class:`~bcl_stream.records.chat.Conversation` whose completion is what is trained.

An existing dataset read with this kind (``response_field``; the prompt is ``tokens_field``
or ``text_field``) yields ``input_ids`` = prompt + response and ``loss_spans`` = the response:
for text, exactly as ``preprocess`` encodes a record; for stored ids, concatenated as stored.
Its knobs: ``text_field`` or ``tokens_field`` (the prompt), ``response_field``, ``tokenizer``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.formats.token_ids import as_text, token_ids
from bcl_stream.records.chat import Conversation, read_messages, tools_and_kwargs
from bcl_stream.records.kind import (
    IDS,
    Bad,
    Encoders,
    FoundColumns,
    Ids,
    LayoutOptions,
    needs_tokenizer,
    no_loss_on,
)
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import Encoded, Encoder, TokenIdError

RESPONSE_FIELDS = ("response", "completion")
"""llm-foundry's and TRL's names for what follows the prompt."""


@dataclass(frozen=True, slots=True)
class PromptResponse:
    prompt: str | list[int]
    response: str | list[int]
    fields: tuple[str, str] = field(default=("prompt", "response"))


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


def _read(source: str, record: dict[str, Any], second: str) -> Any:
    prompt, response = record["prompt"], record[second]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        first = read_messages(prompt, "prompt")
        rest = read_messages(response, second)
        if isinstance(first, str) or isinstance(rest, str):
            return Bad(source, "bad_messages", first if isinstance(first, str) else str(rest))
        extra = tools_and_kwargs(record)
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


def encode_prompt_response(shape: PromptResponse, encoder: Encoder) -> Encoded:
    """Prompt ids, response ids, then EOS (when the tokenizer has one and the response
    does not already end with it); the response and its EOS are trained."""
    if isinstance(shape.prompt, str):
        assert isinstance(shape.response, str)
        prompt = encoder.prompt_ids(shape.prompt)
        response = encoder.tokenizer.ids(shape.response)
    else:
        prompt = np.asarray(shape.prompt, dtype=np.uint32)
        response = np.asarray(shape.response, dtype=np.uint32)
        _check_vocabulary(shape, prompt, response, encoder)
    eos = encoder.eos_id
    if eos is not None and (not response.size or int(response[-1]) != eos):
        response = np.append(response, np.uint32(eos))
    ids = np.concatenate([prompt, response]).astype(np.uint32)
    if encoder.loss_on == "all":
        return Encoded(ids)
    return Encoded(ids, np.asarray([prompt.size, ids.size], dtype=np.uint32))


def _check_vocabulary(
    shape: PromptResponse,
    prompt: npt.NDArray[np.uint32],
    response: npt.NDArray[np.uint32],
    encoder: Encoder,
) -> None:
    """Given ids must be ids of this tokenizer: one past its vocabulary would be an
    out-of-range embedding lookup at training time (a device assert on a GPU)."""
    size = encoder.vocab_size
    for name, ids in zip(shape.fields, (prompt, response), strict=True):
        if ids.size and int(ids.max()) >= size:
            i = int(np.flatnonzero(ids >= size)[0])
            raise TokenIdError(
                f"field {name!r} holds token id {int(ids[i])} at position {i}, outside the "
                f"vocabulary of tokenizer {encoder.tokenizer.name} ({size} ids); were the ids "
                "made with another tokenizer? Pass --tokenizer with the one that made them"
            )


def prompt_response_ids(
    prompt: Any, response: Any, source: RecordSource, where: str, encoders: Encoders
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """(ids, loss spans) of a stored prompt/response record read with
    ``source.response_field``: text encoded as ``preprocess`` encodes a prompt/response record
    (the response then the tokenizer's EOS), ids concatenated as stored; the response is
    trained."""
    if source.is_text:
        texts = [
            as_text(v, f, source, where)
            for v, f in ((prompt, source.field), (response, source.response_field))
        ]
        encoded = encode_prompt_response(
            PromptResponse(texts[0], texts[1]), encoders(str(source.tokenizer), "assistant")
        )
        assert encoded.spans is not None
        return encoded.ids, encoded.spans
    first = token_ids(prompt, source, where)
    alone = replace(source, tokens_field=str(source.response_field), response_field=None)
    second = token_ids(response, alone, where)
    ids = np.concatenate([first, second]).astype(np.uint32)
    return ids, np.asarray([first.size, ids.size] if second.size else [], dtype=np.uint32)


class PromptResponseKind:
    """A prompt and its response (the module docstring)."""

    name = "prompt_response"
    shape: type = PromptResponse
    what = "prompt/response columns (llm-foundry's finetuning layout)"
    knobs: tuple[str, ...] = ("text_field", "tokens_field", "response_field", "tokenizer")

    def detect(self, names: Collection[str], options: LayoutOptions) -> tuple[str, ...] | None:
        if options.messages_field is None and "prompt" in names:
            second = next((r for r in RESPONSE_FIELDS if r in names), None)
            if second is not None:
                return ("prompt", second)
        return None

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        return _read(where, record, fields[1])

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        return encode_prompt_response(shape, encoder)

    def declared(self, found: FoundColumns) -> RecordSource:
        first, response = found.fields[0], found.fields[1]
        no_loss_on(found)
        if found.columns[first] == IDS:
            return RecordSource(tokens_field=first, response_field=response)
        spec = needs_tokenizer(self, found)
        return RecordSource(text_field=first, tokenizer=spec, response_field=response)

    def reads(self, source: RecordSource) -> bool:
        return source.response_field is not None

    def stored(
        self, values: Sequence[Any], source: RecordSource, where: str, encoders: Encoders
    ) -> Ids:
        return prompt_response_ids(values[0], values[1], source, where, encoders)


PROMPT_RESPONSE = PromptResponseKind()
