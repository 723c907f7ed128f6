"""Per-record cost components of image-text data, stored beside the cost index.

Why: an image-text record costs two things, the vision encoder's work on each image's patches
and the language model's work on its text tokens plus image tokens. The cost index stores one
cost per record; storing the *components* too (text tokens, image tokens, patches per image)
lets any cost model, calibrated later, re-cost the data without rewriting a shard.

Storage: ``bcl_components.npz`` beside ``bcl_costs.npy`` (uncompressed ``.npz``, four int64
arrays, see :class:`RecordComponents`), written before ``bcl_index.json``. The JSON names it in
its sealed provenance (``extra.components``: file, SHA-256 of the file, record and image
counts), so the file cannot be swapped or damaged unnoticed, and no index format bump is needed:
an index without the entry (every text dataset, every index written before) reads as text-only
(:func:`read_components` returns None). Memory: 24 B per record plus 8 B per image, loaded only
by whoever asks for the components (cost recomputation, ``inspect``), never on the read path.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.io.index_meta import COMPONENTS_FILE, INDEX_JSON, column_stats, read_index_json
from bcl_stream.io.index_meta import fail as _fail

COMPONENTS_KEY = "components"
"""The key of ``bcl_index.json``'s ``extra`` that names the components file."""
FIELDS = ("text_tokens", "image_tokens", "image_offsets", "image_patches")


@dataclass(frozen=True, slots=True)
class RecordComponents:
    """Cost components by global record id (every array int64, read-only)."""

    text_tokens: npt.NDArray[np.int64]
    """Tokens that are not image tokens, one per record."""
    image_tokens: npt.NDArray[np.int64]
    """LM tokens of the record's images (the expanded image-pad tokens), one per record; 0 for
    a text-only record."""
    image_offsets: npt.NDArray[np.int64]
    """``n_records + 1`` offsets into ``image_patches``: record ``i``'s images are
    ``image_patches[image_offsets[i]:image_offsets[i + 1]]``."""
    image_patches: npt.NDArray[np.int64]
    """Encoder patches of each image (``t * gh * gw``), in record order."""

    def __post_init__(self) -> None:
        n = None
        for name in FIELDS:
            values = getattr(self, name)
            if not isinstance(values, np.ndarray) or values.dtype != np.int64 or values.ndim != 1:
                raise ValueError(f"{name} must be a 1-D int64 array, got {_describe(values)}")
            if values.size and int(values.min()) < 0:
                raise ValueError(f"{name} holds a negative value ({int(values.min())})")
            values.flags.writeable = False
        n = self.text_tokens.size
        if self.image_tokens.size != n:
            raise ValueError(f"image_tokens has {self.image_tokens.size} records, text_tokens {n}")
        offsets = self.image_offsets
        if offsets.size != n + 1 or offsets[0] != 0 or offsets[-1] != self.image_patches.size:
            raise ValueError(
                f"image_offsets must hold {n + 1} values from 0 to {self.image_patches.size} "
                f"(the images), got {offsets.size} from "
                f"{offsets[0] if offsets.size else None} to {offsets[-1] if offsets.size else None}"
            )
        if (np.diff(offsets) < 0).any():
            raise ValueError("image_offsets decrease")
        bare = np.flatnonzero((np.diff(offsets) == 0) & (self.image_tokens != 0))
        if bare.size:
            raise ValueError(
                f"record {int(bare[0])} has {int(self.image_tokens[bare[0]])} image tokens but no image"
            )

    def __len__(self) -> int:
        return int(self.text_tokens.size)

    @property
    def n_images(self) -> int:
        return int(self.image_patches.size)

    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """Every LM token of each record: text plus image tokens (the cost index's ``tokens``)."""
        return self.text_tokens + self.image_tokens

    @property
    def images_per_record(self) -> npt.NDArray[np.int64]:
        return np.diff(self.image_offsets)

    def patches_of(self, record: int) -> npt.NDArray[np.int64]:
        """Patches of each image of one record."""
        return self.image_patches[self.image_offsets[record] : self.image_offsets[record + 1]]

    @classmethod
    def build(cls, records: Iterable[tuple[int, int, Sequence[int]]]) -> RecordComponents:
        """From ``(text tokens, image tokens, [patches per image])`` per record."""
        text: list[int] = []
        image: list[int] = []
        counts: list[int] = []
        patches: list[int] = []
        for t, i, p in records:
            text.append(t)
            image.append(i)
            counts.append(len(p))
            patches.extend(p)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(
            np.asarray(text, dtype=np.int64),
            np.asarray(image, dtype=np.int64),
            offsets,
            np.asarray(patches, dtype=np.int64),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[RecordComponents]) -> RecordComponents:
        """Parts in record order (shards, merged partial outputs) as one."""
        offsets = [np.zeros(1, dtype=np.int64)]
        base = 0
        for part in parts:
            offsets.append(part.image_offsets[1:] + base)
            base += part.n_images
        return cls(
            np.concatenate([np.zeros(0, np.int64), *(p.text_tokens for p in parts)]),
            np.concatenate([np.zeros(0, np.int64), *(p.image_tokens for p in parts)]),
            np.concatenate(offsets),
            np.concatenate([np.zeros(0, np.int64), *(p.image_patches for p in parts)]),
        )

    def summary(self) -> dict[str, Any]:
        """What ``inspect`` reports: image tokens and patches (total, mean, max) and counts."""

        return {
            "records_with_images": int((self.images_per_record > 0).sum()),
            "images": self.n_images,
            "text_tokens": column_stats(self.text_tokens),
            "image_tokens": column_stats(self.image_tokens),
            "patches": column_stats(self.image_patches),
        }


def _describe(values: Any) -> str:
    if isinstance(values, np.ndarray):
        return f"{values.dtype} of shape {values.shape}"
    return type(values).__name__


def write_components(
    directory: str | os.PathLike[str], components: RecordComponents
) -> dict[str, Any]:
    """Write ``bcl_components.npz`` atomically into ``directory``; return the entry for the
    index's ``extra[COMPONENTS_KEY]`` (write the index JSON after this)."""
    data, entry = components_file(components)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / (COMPONENTS_FILE + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, root / COMPONENTS_FILE)
    return entry


def components_file(components: RecordComponents) -> tuple[bytes, dict[str, Any]]:
    """The bytes of ``bcl_components.npz`` and the index's ``extra[COMPONENTS_KEY]`` entry that
    seals them, for a writer that builds the index before it writes the file (``merge``)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: getattr(components, name) for name in FIELDS})
    data = buffer.getvalue()
    return data, {
        "file": COMPONENTS_FILE,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(components),
        "images": components.n_images,
    }


def read_components(
    directory: str | os.PathLike[str], tokens: npt.ArrayLike | None = None
) -> RecordComponents | None:
    """The components ``bcl_index.json`` in ``directory`` names, or None for a text-only index
    (no entry). ``tokens``: the index's token counts, checked to equal text plus image tokens.

    A missing, damaged or mismatched file is a :class:`~bcl_stream.errors.CostIndexError`
    naming it and what to do.
    """
    root = Path(directory)
    data = read_index_json(root)
    extra = data.get("extra")
    entry = extra.get(COMPONENTS_KEY) if isinstance(extra, dict) else None
    if entry is None:
        return None
    meta, path = root / INDEX_JSON, root / COMPONENTS_FILE
    if (
        not isinstance(entry, dict)
        or entry.get("file") != COMPONENTS_FILE
        or not isinstance(entry.get("sha256"), str)
        or entry.get("records") != data["records"]
    ):
        raise _fail(meta, f"extra.{COMPONENTS_KEY} is malformed: {str(entry)[:200]}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise _fail(
            path, "the image-text components are missing although bcl_index.json names them"
        ) from exc
    if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
        raise _fail(path, "SHA-256 does not match bcl_index.json (changed or corrupted)")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {name: np.array(npz[name]) for name in FIELDS}
        components = RecordComponents(**arrays)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise _fail(path, f"unreadable image-text components ({exc})") from exc
    if len(components) != data["records"] or components.n_images != entry.get("images"):
        raise _fail(
            path,
            f"holds {len(components)} records and {components.n_images} images, bcl_index.json "
            f"says {data['records']} and {entry.get('images')}",
        )
    if tokens is not None:
        want = np.asarray(tokens).astype(np.int64)
        bad = np.flatnonzero(want != components.tokens)
        if bad.size:
            i = int(bad[0])
            raise _fail(
                path,
                f"record {i}: {int(components.text_tokens[i])} text + "
                f"{int(components.image_tokens[i])} image tokens, but the cost index stores "
                f"{int(want[i])} tokens",
            )
    return components
