"""Token counts, trained counts and cost components of an image-text dataset annotated in place
(``annotate --processor DIR``), one shard at a time.

Each record is read whole as ``preprocess --processor`` reads the same data: a WebDataset
record's members through ``sources.tar_record`` (img2dataset's ``NNN.jpg`` + ``NNN.txt`` +
``NNN.json``: the caption trained as the answer to the image), an MDS record's columns as
streaming decodes them (image columns of ``bytes``, ``jpeg`` or ``png`` encoding: the file's
bytes; streaming opens ``jpeg``/``png`` lazily, so no pixel is decoded). It is then encoded by
``records/registry.encode_any``, the function preprocessing uses, so the counts and the
components are preprocessing's for the same records; image sizes come from the headers
(``vision/image_header``). A bad image is one line naming the record, its reason and what to do
(``image_text.in_place_error``): a dataset read in place cannot skip a record.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

from bcl_stream.errors import DatasetError
from bcl_stream.formats.tar_scan import TAR_ERRORS, tar_records
from bcl_stream.io.hashing import record_digest
from bcl_stream.preprocess.column_counts import decoded_values
from bcl_stream.preprocess.sources import tar_record
from bcl_stream.records.image_text import in_place_error, processor_encoder
from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.records.registry import encode_any
from bcl_stream.records.source import RecordSource
from bcl_stream.text.loss_spans import trained_count
from bcl_stream.vision.encode import ImageEncoded

Components = list[tuple[int, int, tuple[int, ...]]]
"""(text tokens, image tokens, patches of each image) per record (``RecordComponents.build``)."""


def image_shard_counts(
    root: Path, name: str, mds: dict[str, Any] | None, source: RecordSource
) -> tuple[list[int], list[int], array[int] | None, Components]:
    """(token counts, trained counts, record hashes (WebDataset; None for MDS, whose hashes
    come from the shard bytes), components) of one shard's records, in order."""
    if source.processor is None:
        raise ValueError("image_shard_counts needs a source with a processor")
    encoder = processor_encoder(source.processor, source.loss_on)
    counts: list[int] = []
    trained: list[int] = []
    components: Components = []
    hashes = None if mds is not None else array("Q")

    def add(where: str, record: dict[str, Any]) -> None:
        out = encode_any(where, record, encoder, LayoutOptions())
        if isinstance(out, Bad):
            raise in_place_error(out)
        n = int(out.ids.size)
        counts.append(n)
        trained.append(max(n - 1, 0) if out.spans is None else trained_count(out.spans, n))
        if isinstance(out, ImageEncoded):
            components.append((out.text_tokens, out.image_tokens, tuple(out.patches)))
        else:
            components.append((n, 0, ()))

    if mds is not None:
        for i, record in enumerate(decoded_values(root, mds, None, None)):
            add(f"{root / name} sample {i}", dict(record))
        return counts, trained, hashes, components
    assert hashes is not None
    try:
        for key, member_list in tar_records(root / name):
            hashes.append(record_digest(dict(member_list).items()))
            add(f"{root / name}:{key}", tar_record(member_list))
    except TAR_ERRORS as exc:
        raise DatasetError(
            f"{root / name}: unreadable tar shard ({exc}); re-download or rewrite the shard"
        ) from exc
    return counts, trained, hashes, components
