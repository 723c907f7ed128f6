"""``bcl_index.json``: its fields, the seal that ties them together, and their validation.

The cost array is covered by its SHA-256 (``sha256``), but a plan also depends on what the
JSON says about it: the cost model, the shard table, the record count, the dataset format and
the per-record hashes. Format 3 seals each of those fields: ``fields_sha256`` maps every name
in :data:`SEALED_FIELDS` to the SHA-256 of its canonical JSON (sorted keys, no spaces). Any
edit after ``annotate`` (or a writer) wrote the file is refused naming the field, so a
hand-edited ``cost_model.a`` can no longer make stored costs and the model disagree silently.

The seal is an integrity check against edits and damage, not a signature: whoever rewrites the
file can recompute it. :func:`check_costs_follow_model` closes the remaining gap between the
array and the JSON: a sample of stored costs must equal the model applied to the stored token
counts.

Formats 1 and 2 (no seal) are still read, with one warning per dataset and process that the
metadata goes unverified and how to add the seal (``annotate --overwrite``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import CostModel
from bcl_stream.errors import CostIndexError
from bcl_stream.io.hashing import RECORD_HASH
from bcl_stream.io.names import check_name

INDEX_JSON = "bcl_index.json"
COSTS_NPY = "bcl_costs.npy"
HASHES_NPY = "bcl_hashes.npy"
COMPONENTS_FILE = "bcl_components.npz"
"""Image-text records' cost components (:mod:`bcl_stream.vision.components`), named by the
sealed ``extra.components``; text datasets have none."""
INDEX_FILES = (COSTS_NPY, HASHES_NPY, COMPONENTS_FILE, INDEX_JSON)
"""Every file of a cost index, in the order it is written and uploaded: the arrays, then the
JSON that seals them, so a reader that finds the JSON finds its arrays. MDS has no hashes file;
text datasets have no components file."""
FORMAT_VERSION = 4
"""4: each record's trained-token count (field ``trained`` of ``bcl_costs.npy``, 12 bytes per
record; summarized under ``summary.trained``); 3: adds ``fields_sha256`` (every field that
decides a plan is sealed); 2: per-record content hashes (``record_hashes``); 1: none of these.
1 to 3 are still read (trained = max(tokens - 1, 0)), 1 and 2 with a warning."""
READABLE_VERSIONS = (1, 2, 3, 4)
TRAINED_VERSION = 4
"""The first format whose records store ``trained``."""
SEALED_FIELDS = ("format", "records", "cost_model", "shards", "sha256", "record_hashes", "extra")
"""Every field of ``bcl_index.json`` a reader uses: the plan's inputs (cost model, shard table,
record count, format, the arrays' hashes) and the provenance ``extra``. Only ``summary`` (derived
from the array) and ``costs_file`` (a constant) are outside the seal."""
FIELDS_KEY = "fields_sha256"
COST_BLOCKS, COST_BLOCK = 4, 1024
"""Stored costs compared with the cost model on open: 4 runs of 1024 consecutive records,
evenly spaced (~100 us; a few pages of the mapping, not pages all over the file)."""


def column_stats(values: npt.ArrayLike) -> dict[str, float]:
    """Total, mean, median, p99 and max of a per-record (or per-image) column, all 0 when it
    is empty: the statistics ``bcl_index.json`` stores and ``inspect`` shows, one shape for
    every column (tokens, costs, trained tokens, image tokens, patches)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"total": 0.0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "total": float(v.sum()),
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "p99": float(np.percentile(v, 99)),
        "max": float(v.max()),
    }


def fail(path: Path, what: str) -> CostIndexError:
    """The one error for a cost-index problem: the file, what is wrong, and what to do."""
    return CostIndexError(
        f"{path}: {what}. Rebuild the cost index with "
        f"`bcl-stream annotate --overwrite {path.parent}` (or re-run `bcl-stream preprocess`)."
    )


def field_hash(value: Any) -> str:
    """SHA-256 of a JSON value in canonical form (sorted keys, compact separators)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``format_version`` set to the current one and ``fields_sha256`` added."""
    sealed = {**doc, "format_version": FORMAT_VERSION}
    sealed[FIELDS_KEY] = {name: field_hash(doc.get(name)) for name in SEALED_FIELDS}
    return sealed


def check_seal(meta: Path, data: dict[str, Any]) -> None:
    """Refuse a format-3 document whose sealed fields were edited, naming the first one;
    warn once (per file and process) that a format 1 or 2 document is unverified."""
    if data["format_version"] < 3:
        _warn_unsealed(meta, data["format_version"])
        return
    stored = data.get(FIELDS_KEY)
    if not isinstance(stored, dict) or set(stored) != set(SEALED_FIELDS):
        raise fail(meta, f"field {FIELDS_KEY!r} is missing or malformed")
    for name in SEALED_FIELDS:
        try:
            now = field_hash(data.get(name))
        except ValueError as exc:  # NaN or infinity: not canonical JSON
            raise fail(meta, f"field {name!r} holds a value JSON cannot seal ({exc})") from exc
        if stored[name] != now:
            raise fail(
                meta,
                f"field {name!r} was changed after the index was written (its SHA-256 does not "
                f"match {FIELDS_KEY}); a plan depends on it, so the index is refused. To use "
                "another cost model, pass it at read time (costs are recomputed from the stored "
                "tokens) or re-annotate with --cost-model",
            )


_WARNED: set[str] = set()


def _warn_unsealed(meta: Path, version: int) -> None:
    if str(meta) in _WARNED:
        return
    _WARNED.add(str(meta))
    warnings.warn(
        f"{meta}: cost index format {version} does not seal its metadata: an edit to the cost "
        f"model or the shard table will NOT be detected. Seal it with "
        f"`bcl-stream annotate --overwrite {meta.parent}` (the shards are not rewritten).",
        UserWarning,
        stacklevel=4,
    )


def check_costs_follow_model(path: Path, records: npt.NDArray[np.void], model: CostModel) -> None:
    """Refuse an index whose stored costs are not ``model`` applied to its stored tokens (or
    that stores more trained tokens than a record can train), on
    ``COST_BLOCKS`` runs of ``COST_BLOCK`` records (both sides rounded to float32, as the writer
    stores them). A changed model changes every record's cost, so any run shows it."""
    n = len(records)
    starts = np.unique(np.linspace(0, max(n - COST_BLOCK, 0), num=COST_BLOCKS, dtype=np.int64))
    for lo in starts.tolist():
        run = records[lo : lo + COST_BLOCK]
        want = model.cost(run["tokens"]).astype(np.float32)
        bad = np.flatnonzero(run["cost"] != want)
        if bad.size:
            i = int(bad[0])
            raise fail(
                path,
                f"stored costs disagree with the cost model {model.name!r}: record {lo + i} "
                f"({int(run['tokens'][i])} tokens) stores {float(run['cost'][i])!r}, the model "
                f"gives {float(want[i])!r}",
            )
        if "trained" in (run.dtype.names or ()):
            over = np.flatnonzero(
                run["trained"].astype(np.int64) > np.maximum(run["tokens"], 1) - 1
            )
            if over.size:
                i = int(over[0])
                raise fail(
                    path,
                    f"record {lo + i} stores {int(run['trained'][i])} trained tokens of "
                    f"{int(run['tokens'][i])} (at most tokens - 1 can be trained)",
                )


def read_index_json(directory: str | Path) -> dict[str, Any]:
    """The parsed, structurally validated and seal-checked ``bcl_index.json`` (the array is not
    loaded)."""
    meta = Path(directory) / INDEX_JSON
    if not meta.is_file():
        raise fail(meta, "no cost index found (this dataset has no bcl-stream costs yet)")
    try:
        data = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(meta, f"unreadable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise fail(meta, f"expected a JSON object, found {type(data).__name__}")
    version = data.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise fail(
            meta,
            f"format_version {version!r} is not supported (this reader reads "
            f"{READABLE_VERSIONS}; a newer bcl-stream wrote it, or the file is damaged)",
        )
    hashes = data.get("record_hashes")
    if hashes is not None and (
        not isinstance(hashes, dict)
        or hashes.get("file") != HASHES_NPY
        or hashes.get("algorithm") != RECORD_HASH
        or not isinstance(hashes.get("sha256"), str)
    ):
        raise fail(meta, f"field 'record_hashes' is malformed: {hashes!r}")
    for key, kind in (
        ("format", str),
        ("records", int),
        ("cost_model", dict),
        ("shards", list),
        ("sha256", str),
    ):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise fail(meta, f"field {key!r} is missing or not a {kind.__name__}")
    for i, shard in enumerate(data["shards"]):
        if (
            not isinstance(shard, dict)
            or not isinstance(shard.get("name"), str)
            or not isinstance(shard.get("samples"), int)
            or isinstance(shard.get("samples"), bool)
            or shard["samples"] < 0
        ):
            raise fail(meta, f"shard entry {i} is malformed: {str(shard)[:200]}")
        check_name(shard["name"], "shard", f"{meta}: shard entry {i}")
    check_seal(meta, data)
    return data
