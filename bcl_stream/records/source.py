"""The one declaration of a record source: where a record's token ids come from (a column of
ids of any name, raw integer bytes, or a text column tokenized on the fly), and the tokenizer,
fields and chat-template knobs that turn a record into ids and a loss mask.

One frozen :class:`RecordSource` is built once from the CLI flags (``preprocess``,
``annotate``) or the YAML ``data.tokens`` group (the DataModule) and handed to ``preprocess``,
``annotate`` and the readers; none of them restates its knobs. ``preprocess`` reads it as
where to look in a source record (a field not given takes its default: ``text_field``
``text``, ``tokenizer`` ``cl100k``, ``loss_on`` ``assistant``); the readers and ``annotate``
read it as the exact columns of an existing dataset, with the rules of :meth:`checked`.

Why: existing datasets are not all laid out as bcl-stream writes them (``input_ids``, an
``ndarray:uint32`` column). llm-foundry's ``convert_dataset_hf --concat_tokens`` writes a
``tokens`` column of raw ``int64`` bytes; its text datasets, and most WebDatasets, hold only
text. ``annotate`` counts tokens from the same source the readers then read, and both record
which (the cost index in ``extra.annotate``, the reader cursor in its config), so a count from
one tokenizer is never read with another.

Prompt/response datasets (llm-foundry's finetuning layout: ``prompt`` + ``response`` text
columns, or its pre-tokenized ``input_ids`` (the prompt) + ``labels`` (the response)) are read
with ``response_field``: a record's ``input_ids`` are the prompt's ids then the response's
(for text, exactly as ``preprocess`` encodes a prompt/response record: the response followed by
the tokenizer's EOS), and its ``loss_spans`` train the response: ``[len(prompt), len(ids)]``.

Conversations stored in an existing dataset (a ``messages`` column or json key) are read with
``messages_field`` + ``tokenizer``: rendered on every read exactly as ``preprocess`` renders
them (the tokenizer directory's chat template, or the built-in ChatML), their mask by
``loss_on``; like a text column tokenized on the fly, it costs the readers that work each epoch.

This module is the configuration only (pure, no I/O): :mod:`bcl_stream.formats.token_ids`
turns a column's value into ids and counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bcl_stream.text.templates import LOSS_ON

DEFAULT_FIELD = "input_ids"
KEYS = (
    "tokens_field",
    "tokens_dtype",
    "text_field",
    "tokenizer",
    "response_field",
    "messages_field",
    "loss_on",
    "chat_template",
    "chat_template_kwargs",
    "processor",
)
"""Every knob, in the order indexes and cursors record them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordSource:
    """The column a record's token ids are read from, and how."""

    tokens_field: str = DEFAULT_FIELD
    """Column (MDS) or member (WebDataset: ``<key>.<field>.npy`` or ``<key>.<field>``) of token
    ids: an integer array, or raw integer bytes with ``tokens_dtype``."""
    tokens_dtype: str | None = None
    """Integer dtype of a raw-bytes token column (``int64`` for llm-foundry's ``tokens``);
    None: the column must be an integer array."""
    text_field: str | None = None
    """A text column (or WebDataset member, or key of its ``json`` member) to tokenize instead
    of reading ids; needs ``tokenizer``."""
    tokenizer: str | None = None
    """``cl100k`` (offline tiktoken), a local ``tokenizer.json`` or Hugging Face tokenizer
    directory: what ``annotate --text-field`` counted with."""
    response_field: str | None = None
    """The response column of a prompt/response record (the prompt is ``tokens_field`` or
    ``text_field``, the response the same kind): ids = prompt + response, the response
    trained (see the module docstring). None: one column holds the whole record."""
    messages_field: str | None = None
    """A conversation column (a list of messages, or its JSON text) rendered with
    ``tokenizer``'s chat template (or the built-in ChatML) as ``preprocess`` renders it; its
    mask follows ``loss_on``. Needs ``tokenizer``; excludes the other columns."""
    loss_on: str | None = None
    """The trained tokens of a conversation: ``assistant`` (None means it), ``last`` or
    ``all`` (``preprocess``: also ``all`` for prompt/response records, which then store no
    mask)."""
    chat_template: str | None = None
    """A file whose template renders conversations instead of the tokenizer directory's own
    (Jinja text, or a JSON file with ``chat_template``); needs a Hugging Face tokenizer
    directory."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Template variables given to every conversation (a record's own
    ``chat_template_kwargs`` take precedence)."""
    processor: str | None = None
    """A Hugging Face processor directory: image-text records (an img2dataset WebDataset's
    image + caption members, MDS image columns) read whole and encoded through it, with the
    image tokens expanded, exactly as ``preprocess --processor`` encodes them
    (``records/image_text.py``). Takes ``loss_on`` and no other knob."""

    def __post_init__(self) -> None:
        for name in KEYS:
            value = getattr(self, name)
            if name == "chat_template_kwargs":
                if value is not None and not isinstance(value, dict):
                    raise ValueError(f"{name} must be a dict or None, got {value!r}")
            elif value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
        if self.loss_on not in (None, *LOSS_ON):
            raise ValueError(f"loss_on must be one of {LOSS_ON}, got {self.loss_on!r}")
        if self.tokens_dtype is not None:
            try:
                dtype = np.dtype(self.tokens_dtype)
            except TypeError as exc:
                raise ValueError(f"tokens_dtype {self.tokens_dtype!r} is not a dtype") from exc
            if not np.issubdtype(dtype, np.integer):
                raise ValueError(
                    f"tokens_dtype must be an integer dtype (int64, uint32, ...), got "
                    f"{self.tokens_dtype!r}"
                )

    @property
    def named(self) -> bool:
        """Whether a column is named (else ``annotate`` finds the columns by their names)."""
        return self.tokens_field != DEFAULT_FIELD or any(
            getattr(self, k) is not None
            for k in ("tokens_dtype", "text_field", "response_field", "messages_field", "processor")
        )

    def checked(self) -> RecordSource:
        """``self`` if it names the columns of an existing dataset consistently (what the
        readers and ``annotate`` read), else a :class:`ValueError` saying which knobs do not
        go together."""
        if self.processor is not None:
            others = [
                k
                for k in KEYS
                if k not in ("processor", "loss_on", "tokens_field") and getattr(self, k)
            ]
            if self.tokens_field != DEFAULT_FIELD or others:
                raise ValueError(
                    "processor reads whole image-text records with the processor's tokenizer "
                    "and chat template; it takes loss_on and no other knob (got "
                    f"{', '.join(others) or 'tokens_field'})"
                )
            return self
        if self.messages_field is not None:
            if (
                self.tokenizer is None
                or any(
                    getattr(self, k) is not None
                    for k in ("text_field", "tokens_dtype", "response_field")
                )
                or self.tokens_field != DEFAULT_FIELD
            ):
                raise ValueError(
                    "messages_field takes a tokenizer (whose chat template renders it) and no "
                    "other column (tokens_field, tokens_dtype, text_field, response_field)"
                )
            return self
        if self.loss_on is not None:
            raise ValueError("loss_on goes with messages_field (a conversation column)")
        if self.chat_template is not None or self.chat_template_kwargs is not None:
            raise ValueError(
                "chat_template and chat_template_kwargs go with messages_field (a "
                "conversation column)"
            )
        if (self.text_field is None) != (self.tokenizer is None):
            raise ValueError(
                "text_field and tokenizer go together: a text column is tokenized with a "
                f"tokenizer (got text_field={self.text_field!r}, tokenizer={self.tokenizer!r})"
            )
        if self.text_field is not None and (
            self.tokens_dtype is not None or self.tokens_field != DEFAULT_FIELD
        ):
            raise ValueError(
                "give either a token column (tokens_field, tokens_dtype) or a text column "
                "(text_field, tokenizer), not both"
            )
        if self.response_field is not None and self.response_field == self.field:
            raise ValueError(
                f"response_field {self.response_field!r} is the prompt column too; name the "
                "prompt with tokens_field or text_field and the response apart"
            )
        return self

    @property
    def is_text(self) -> bool:
        return self.text_field is not None

    @property
    def is_conversation(self) -> bool:
        return self.messages_field is not None

    @property
    def field(self) -> str:
        """The column read."""
        if self.messages_field is not None:
            return self.messages_field
        return self.text_field if self.text_field is not None else self.tokens_field

    @property
    def fields(self) -> tuple[str, ...]:
        """Every column read: the prompt (or only) column, then the response column; none
        for image-text records under a ``processor``, which are read whole."""
        if self.processor is not None:
            return ()
        return (self.field,) if self.response_field is None else (self.field, self.response_field)

    def describe(self) -> str:
        """How messages name it: ``column 'tokens' (raw int64 bytes)``."""
        if self.processor is not None:
            return (
                f"image-text records encoded with the processor {self.processor} (loss on "
                f"{self.loss_on or 'assistant'})"
            )
        if self.messages_field is not None:
            return (
                f"conversation column {self.messages_field!r} rendered with {self.tokenizer} "
                f"(loss on {self.loss_on or 'assistant'})"
            )
        if self.text_field is not None:
            what = f"text column {self.text_field!r}"
            tail = f" tokenized with {self.tokenizer}"
        else:
            raw = f" (raw {self.tokens_dtype} bytes)" if self.tokens_dtype else ""
            what, tail = f"token column {self.tokens_field!r}", raw
        if self.response_field is not None:
            return f"prompt {what} + response column {self.response_field!r}{tail}"
        return what + tail

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the default (what indexes and cursors record)."""
        default = RecordSource()
        return {k: getattr(self, k) for k in KEYS if getattr(self, k) != getattr(default, k)}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RecordSource:
        """The source the command-line options name (``vars(args)``: ``--text-field`` is
        ``text_field``, ...): every knob among ``options`` that is set, the rest at their
        defaults. Built once, then handed to ``preprocess`` or ``annotate``."""
        return cls(**{k: options[k] for k in KEYS if options.get(k) is not None})

    @classmethod
    def from_dict(cls, data: Any) -> RecordSource:
        if not isinstance(data, dict) or set(data) - set(KEYS):
            raise ValueError(f"a token source is a dict with keys among {KEYS}, got {data!r}")
        return cls(**data).checked()

    @classmethod
    def of(cls, value: RecordSource | dict[str, Any] | None) -> RecordSource | None:
        """``value`` as a source; None and the default source are None (the stored
        ``input_ids``, what every earlier cursor meant)."""
        if isinstance(value, RecordSource):
            source: RecordSource | None = value.checked()
        else:
            source = None if value is None else cls.from_dict(value)
        return None if source is None or source == cls() else source
