"""What a record kind is: the protocol every kind module implements, and the small types the
kinds, the encoder and the registry share.

Why a protocol: ``preprocess``, ``annotate`` and the on-the-fly readers each used to decide a
record's layout with their own ``if``/``elif`` chain (text, conversation, prompt/response), so
a new kind of record touched each of them. A kind is now one module (``records/text.py``,
``records/chat.py``, ``records/prompt_response.py``) holding an object that satisfies
:class:`RecordKind`; :mod:`bcl_stream.records.registry` lists them in detection order and is
the only place that dispatches on them.

A kind answers four questions (docs/extending.md, "A record kind"):

- :meth:`RecordKind.detect`: do a record's field names (``preprocess``: one JSON record;
  ``annotate``: a dataset's column names) make this kind? The fields it is read from, or None.
- :meth:`RecordKind.read`: one parsed source record -> its *shape* (a small frozen dataclass
  the kind owns, e.g. :class:`~bcl_stream.records.chat.Conversation`), or a :class:`Bad`
  naming what is wrong.
- :meth:`RecordKind.encode`: a shape -> :class:`Encoded` (token ids and the stored loss mask)
  under one :class:`Encoder` (the tokenizer, the chat template, ``loss_on``).
- :meth:`RecordKind.declared` / :meth:`RecordKind.reads` / :meth:`RecordKind.stored`: an
  existing dataset's columns as a :class:`~bcl_stream.records.source.RecordSource`, and the
  ids and mask the readers build from a stored record, exactly as ``preprocess`` would have
  written them.

This module imports nothing of the kinds, the encoder or the readers (no circle): the encoder
is seen through :class:`Encoder`, which ``text/templates.py``'s ``Encoder`` satisfies.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import DatasetError
from bcl_stream.text.templates import (
    Encoded,
    Encoder,
    MissingTemplateError,
    TemplateError,
    TokenIdError,
)

if TYPE_CHECKING:
    from bcl_stream.records.source import RecordSource


@dataclass(frozen=True, slots=True)
class Bad:
    """A record that could not be turned into ids: why (a report key) and a message."""

    source: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class LayoutOptions:
    """Where ``preprocess`` looks for a record's content (picklable: sent to each worker);
    built from the :class:`~bcl_stream.records.source.RecordSource` knobs."""

    text_field: str = "text"
    messages_field: str | None = None
    """None: ``messages`` or ``conversations``."""


@dataclass(frozen=True, slots=True)
class Fields:
    """Which kind a record's field names make, and the fields it is read from."""

    kind: str
    """A registered kind's :attr:`RecordKind.name` (``text``, ``messages``,
    ``prompt_response``)."""
    names: tuple[str, ...]
    """text: (the text field,); messages: (the messages field,); prompt_response: (``prompt``,
    ``response`` or ``completion``)."""


IDS, TEXT, OTHER = "ids", "text", "other"
"""What a stored column holds, as far as choosing a record source goes (``annotate``)."""


@dataclass(frozen=True, slots=True)
class FoundColumns:
    """What ``annotate`` found in an existing dataset when no column option named the record
    source: the fields that made a kind, and the options given with it (one object, so that
    every kind's :meth:`RecordKind.declared` takes the same one argument)."""

    fields: tuple[str, ...]
    """The fields that made the kind (:attr:`Fields.names`)."""
    columns: dict[str, str]
    """Every column's name -> :data:`IDS` / :data:`TEXT` / :data:`OTHER`."""
    tokenizer: str | None
    """``--tokenizer`` (None: not given)."""
    loss_on: str | None
    """``--loss-on`` (None: not given)."""
    where: str
    """The dataset, as an error names it."""


Encoders = Callable[..., Encoder]
"""``(tokenizer spec, loss_on, chat_template=None, template_kwargs=None) -> encoder``: the
readers' per-process encoder cache (``text/templates.py`` ``encoder_for``)."""
Ids = tuple[npt.NDArray[Any], "npt.NDArray[np.uint32] | None"]
"""A stored record's ``input_ids`` and ``loss_spans`` (None: no mask; every token trained)."""


class RecordKind(Protocol):
    """One kind of record (see the module docstring). Implementations are stateless objects
    registered in :data:`bcl_stream.records.registry.KINDS`."""

    name: str
    """The kind's name (:attr:`Fields.kind`)."""
    shape: type
    """The class :meth:`read` returns (the encoder's input; a kind may also read a record as
    another kind's shape, e.g. a TRL conversational prompt-completion as a conversation)."""
    what: str
    """How messages name its columns: ``a conversation column``."""
    knobs: tuple[str, ...]
    """The :class:`~bcl_stream.records.source.RecordSource` fields it reads."""

    def detect(self, names: Collection[str], options: LayoutOptions) -> tuple[str, ...] | None:
        """The fields a record with field ``names`` is read from, or None: not this kind."""
        ...

    def read(self, where: str, record: dict[str, Any], fields: tuple[str, ...]) -> Any:
        """One parsed record -> its shape, or a :class:`Bad`."""
        ...

    def encode(self, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
        """A shape's ids and mask (may raise :class:`TemplateError`), or a :class:`Bad`."""
        ...

    def declared(self, found: FoundColumns) -> RecordSource:
        """The source that reads an existing dataset whose columns made this kind
        (``annotate`` with no column named), or a :class:`DatasetError` naming the option
        that is missing or does not apply (:func:`needs_tokenizer`, :func:`no_loss_on`)."""
        ...

    def reads(self, source: RecordSource) -> bool:
        """Whether a dataset declared by ``source`` holds records of this kind."""
        ...

    def stored(
        self, values: Sequence[Any], source: RecordSource, where: str, encoders: Encoders
    ) -> Ids:
        """The ids and mask of a stored record whose ``source.fields`` hold ``values``."""
        ...


def finish(where: str, result: Encoded | Bad) -> Encoded | Bad:
    """The checks every kind's encoding passes: a mask that trains nothing, or no ids at all,
    is a :class:`Bad` naming the record."""
    if isinstance(result, Bad):
        return result
    if result.spans is not None and result.trained == 0:
        return Bad(
            where, "no_trained_tokens", "the record has no token to train (its mask is empty)"
        )
    if not result.ids.size:
        return Bad(where, "empty_text", "the text is empty (0 tokens)")
    return result


def encode_checked(kind: RecordKind, where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
    """``shape`` encoded by its ``kind``, or a :class:`Bad` (template failure, id outside the
    vocabulary, nothing trained) naming the record."""
    try:
        result = kind.encode(where, shape, encoder)
    except TokenIdError as exc:
        return Bad(where, "bad_token_id", str(exc))
    except TemplateError as exc:
        return Bad(where, "template_error", str(exc))
    except MissingTemplateError as exc:
        raise MissingTemplateError(f"{where}: {exc}") from exc
    return finish(where, result)


def needs_tokenizer(kind: RecordKind, found: FoundColumns) -> str:
    """The tokenizer given, or a :class:`DatasetError`: ``kind``'s text columns need one to
    count."""
    if found.tokenizer is None:
        raise DatasetError(
            f"{found.where}: holds {kind.what} {', '.join(map(repr, found.fields))}; pass "
            "--tokenizer (cl100k, a tokenizer.json or a Hugging Face tokenizer directory) to "
            "count their tokens"
        )
    return found.tokenizer


def no_loss_on(found: FoundColumns) -> None:
    """Refuse ``--loss-on`` for a kind without a conversation to mask."""
    if found.loss_on is not None:
        raise DatasetError(f"{found.where}: --loss-on goes with a conversation column")
