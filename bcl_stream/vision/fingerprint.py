"""A processor directory's content fingerprint: what an image-text index and a reader compare
to know they use the same processor.

Why content and not the path: a processor directory is copied between machines (its path
differs, its files do not), and two directories at one path over time can differ (a processor
re-saved with another ``max_pixels`` or chat template). What decides a record's ids and image
tokens is the tokenizer, the chat template and the image processor's configuration, so the
fingerprint covers exactly those files (:data:`PROCESSOR_FILES`, the ones present). JSON files
are hashed as parsed, in the canonical form the index seals its fields in
(``io.index_meta.field_hash``), so re-indenting or re-ordering one does not change it; any
other change does (a re-save by another transformers version that adds a key included), which
is refused at set-up (``bcl_stream.training.resolve``) rather than found by the collate's
image-token check in a worker.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bcl_stream.io.index_meta import field_hash
from bcl_stream.vision.geometry import PREPROCESSOR_CONFIG, PROCESSOR_CONFIG

PROCESSOR_FILES = (
    PREPROCESSOR_CONFIG,
    PROCESSOR_CONFIG,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.json",
    "chat_template.jinja",
)
"""The files of a Hugging Face processor directory that decide ids and image tokens: the image
processor's configuration (grid, pixel bounds; LLaVA's patch size), the tokenizer's files and
the chat template, in whichever of them the directory has."""

FINGERPRINT_KEY = "processor_sha256"
"""The key of ``extra.vision`` (an image-text index) holding the fingerprint."""


def processor_fingerprint(directory: str | Path) -> str:
    """The SHA-256 (hex) over the name and content of each of :data:`PROCESSOR_FILES` present
    in ``directory`` (JSON as parsed, keys sorted). Raises ``ValueError`` naming a file that
    cannot be read or parsed."""
    root = Path(directory)
    digest = hashlib.sha256()
    for name in PROCESSOR_FILES:
        path = root / name
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
            one = field_hash(json.loads(data)) if name.endswith(".json") else None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"processor file {path}: cannot be read ({exc})") from exc
        digest.update(f"{name}\0{one or hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest()
