"""The registered record kinds, in detection order, and the one place that dispatches on them.

``preprocess`` (per record), ``annotate`` (per dataset, from its column names) and the
on-the-fly readers (per stored record) all go through these functions, so they recognise the
same kinds the same way. A new kind is one module implementing
:class:`~bcl_stream.records.kind.RecordKind` plus its line in :data:`KINDS` (its place in the
detection order).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from bcl_stream.formats.token_ids import record_column
from bcl_stream.records.chat import CHAT, MESSAGES_FIELDS
from bcl_stream.records.image_text import ImageTextKind, encode_image_record, has_images
from bcl_stream.records.kind import (
    Bad,
    Fields,
    FoundColumns,
    LayoutOptions,
    RecordKind,
    encode_checked,
)
from bcl_stream.records.prompt_response import PROMPT_RESPONSE
from bcl_stream.records.source import RecordSource
from bcl_stream.records.text import TEXT
from bcl_stream.text.templates import Encoded, Encoder, encoder_for
from bcl_stream.vision.encode import ImageEncoded, ImageTextEncoder


def encode_any(
    source: str, record: dict[str, Any], encoder: ImageTextEncoder, layout: LayoutOptions
) -> ImageEncoded | Encoded | Bad:
    """A record under a processor (``preprocess --processor``, and image-text datasets read
    in place): with images, the image-text encoding (components and image bytes too);
    without, its own kind's, under the processor's tokenizer and chat template."""
    if has_images(record):
        return encode_image_record(source, record, encoder, layout)
    shape = read_record(source, record, layout)
    return shape if isinstance(shape, Bad) else encode_record(source, shape, encoder.text)


IMAGE_TEXT = ImageTextKind(encode_any)
KINDS: tuple[RecordKind, ...] = (TEXT, CHAT, PROMPT_RESPONSE, IMAGE_TEXT)
"""Detection order: a record's text field if present, else its messages field, else
prompt/response, else an image field (a caption record); the first kind whose
:meth:`~RecordKind.detect` answers reads it."""


def kind_named(name: str) -> RecordKind:
    """The registered kind called ``name``."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"no record kind {name!r}; known: {[k.name for k in KINDS]}")


def kind_of(shape: Any) -> RecordKind:
    """The kind whose shape ``shape`` is (what encodes it)."""
    for kind in KINDS:
        if isinstance(shape, kind.shape):
            return kind
    raise TypeError(f"{type(shape).__name__} is no registered record kind's shape")


def kind_reading(source: RecordSource) -> RecordKind:
    """The kind of the records a dataset declared by ``source`` holds (the last registered
    kind that reads it: the general text/ids kind comes first)."""
    found = [kind for kind in KINDS if kind.reads(source)]
    return found[-1]


def detect(names: Collection[str], options: LayoutOptions) -> Fields | None:
    """The kind a record with fields ``names`` is read as, and the fields it is read from (the
    first in :data:`KINDS` order), or None. The one decision ``preprocess`` (per record) and
    ``annotate`` (per dataset, from its columns) share."""
    for kind in KINDS:
        fields = kind.detect(names, options)
        if fields is not None:
            return Fields(kind.name, fields)
    return None


def read_record(where: str, record: dict[str, Any], options: LayoutOptions) -> Any:
    """The shape of one parsed record (its kind's), or a :class:`Bad` naming why it has none."""
    found = detect(record, options)
    if found is not None:
        return kind_named(found.kind).read(where, record, found.names)
    if options.messages_field is not None:
        return Bad(
            where,
            "missing_field",
            f"no {options.messages_field!r} field (--messages-field; fields: {sorted(record)[:8]})",
        )
    return Bad(
        where,
        "missing_field",
        f"no {options.text_field!r} field, no messages ({' or '.join(MESSAGES_FIELDS)}) and no "
        f"prompt/response (fields: {sorted(record)[:8]}); pass --text-field NAME or "
        "--messages-field NAME",
    )


def encode(shape: Any, encoder: Encoder) -> Encoded:
    """``shape``'s ids and mask by its kind, without the checks :func:`encode_record` makes
    (the encoder's errors propagate; a kind's own refusal, such as a conversation with nothing
    to train, is a :class:`ValueError` with its message). For tools and tests that encode a
    shape they built."""
    result = kind_of(shape).encode("", shape, encoder)
    if isinstance(result, Bad):
        raise ValueError(result.message)
    return result


def encode_record(where: str, shape: Any, encoder: Encoder) -> Encoded | Bad:
    """``shape`` encoded by its kind, or a :class:`Bad` (template failure, nothing trained)
    naming the record ``where``."""
    return encode_checked(kind_of(shape), where, shape, encoder)


def record_ids(record: dict[str, Any], source: RecordSource | None, where: str) -> dict[str, Any]:
    """``record`` with ``input_ids`` read from ``source`` (None: the stored ``input_ids``) by
    the kind that reads it; a kind with a mask (prompt/response, conversation) also sets
    ``loss_spans``."""
    if source is None:
        return record
    values = (
        [record]  # an image-text record under a processor is read whole
        if source.processor is not None
        else [record_column(record, name, where) for name in source.fields]
    )
    ids, spans = kind_reading(source).stored(values, source, where, encoder_for)
    record["input_ids"] = ids
    if spans is not None:
        record["loss_spans"] = spans
    return record


def declared_source(
    columns: Mapping[str, str], tokenizer: str | None, loss_on: str | None, where: str
) -> RecordSource | None:
    """The source of a dataset whose columns are ``columns`` by the kind they make (None: no
    kind recognises them)."""
    found = detect(columns, LayoutOptions())
    if found is None:
        return None
    kind = kind_named(found.kind)
    return kind.declared(FoundColumns(found.names, dict(columns), tokenizer, loss_on, where))
