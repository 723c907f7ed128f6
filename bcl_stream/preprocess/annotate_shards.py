"""The per-shard work of ``annotate`` (``preprocess/annotate.py``): one picklable job per
shard, counted in a worker process (``shard_pool``), and the tally the results add up to in
shard order, so the index is the same for any number of workers.

A shard is counted by its token source (``column_counts.py``: a token, text, conversation or
length column) or, under ``--processor``, as image-text records read whole
(``image_counts.py``), which also gives each record's cost components.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bcl_stream.formats.integrity import mds_record_hashes, raw_shard_bytes
from bcl_stream.io.index import ShardEntry
from bcl_stream.io.names import path_under
from bcl_stream.io.remote import download, join
from bcl_stream.preprocess.column_counts import Counting, mds_shard_counts, wds_shard_counts
from bcl_stream.preprocess.image_counts import Components, image_shard_counts
from bcl_stream.preprocess.wds_keys import key_ids, keys_are_names

ShardCounts = tuple[
    list[int], "list[int] | None", "array[int]", int, "array[int] | None", "Components | None"
]
"""What :func:`count_shard` gives: counts, trained counts (None: no masks), record hashes,
records whose length column was checked, (WebDataset) key ids, (image-text) components."""


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to count (picklable: it crosses to a worker process)."""

    root: str
    """Where the shard is: the dataset (local), or the local copy once fetched."""
    name: str
    """The file to read (an MDS shard's raw or compressed file, a tar)."""
    mds: dict[str, Any] | None
    """The MDS ``index.json`` entry (None: a WebDataset tar)."""
    counting: Counting
    """What is counted (a token source, or a length column)."""
    check: bool = False
    """Check a length column against the token column in this shard (a sample of shards)."""


def count_shard(job: ShardJob) -> ShardCounts:
    """The work of one shard: its counts, trained counts (None: no masks), record hashes, the
    records on which a length column was checked, (WebDataset) the number each record's key
    spells (``wds_keys.key_ids``: a tar with a link member is refused here) and (image-text,
    ``--processor``) each record's cost components."""
    root = Path(job.root)
    if job.counting.source.processor is not None:
        return _image_shard(job, root)
    if job.mds is not None:
        counts, trained, checked = mds_shard_counts(root, job.mds, job.counting, check=job.check)
        name = str(job.mds["raw_data"]["basename"])
        digests = mds_record_hashes(
            raw_shard_bytes(root, job.mds), f"{root / name}", int(job.mds["samples"])
        )
        return counts, trained, array("Q", digests.tobytes()), checked, None, None
    ids = key_ids(root / job.name, job.name)
    counts, trained_wds, hashes, checked = wds_shard_counts(
        root, job.name, job.counting, check=job.check
    )
    return counts, trained_wds, hashes, checked, ids, None


def _image_shard(job: ShardJob, root: Path) -> ShardCounts:
    """An image-text shard under ``--processor`` (``image_counts.py``)."""
    counts, trained, hashes, components = image_shard_counts(
        root, job.name, job.mds, job.counting.source
    )
    if job.mds is not None:
        name = str(job.mds["raw_data"]["basename"])
        digests = mds_record_hashes(
            raw_shard_bytes(root, job.mds), f"{root / name}", int(job.mds["samples"])
        )
        return counts, trained, array("Q", digests.tobytes()), 0, None, components
    assert hashes is not None
    return counts, trained, hashes, 0, key_ids(root / job.name, job.name), components


def fetcher(location: str, tmp: Path) -> tuple[Any, Any]:
    """(fetch, done) for :func:`map_shards`: download a remote shard, delete it after use."""

    def fetch(job: ShardJob) -> ShardJob:
        target = path_under(tmp, job.name, f"{location}: shard {job.name!r}", writing=True)
        download(join(location, job.name), target)
        return replace(job, root=str(tmp))

    def done(job: ShardJob) -> None:
        (tmp / job.name).unlink(missing_ok=True)

    return fetch, done


@dataclass
class Tally:
    """What the shards' counts add up to, gathered in shard order (so the index is the same
    for any number of workers)."""

    counts: list[int] = field(default_factory=list)
    trained: array[int] = field(default_factory=lambda: array("I"))
    masked: bool = False
    """Some shard stored trained-token masks (else every token but the first is trained)."""
    hashes: array[int] = field(default_factory=lambda: array("Q"))
    key_names: bool = False
    """Some all-digit record key is not its record's id (``wds_keys``)."""
    shards: list[ShardEntry] = field(default_factory=list)
    checked: int = 0
    """Records on which a length column was checked."""

    components: Components = field(default_factory=list)
    """Image-text records (``--processor``): each record's cost components."""

    def add(self, result: ShardCounts, name: str) -> int:
        """Add one shard's :func:`count_shard` result; output: its record count."""
        counts, trained, hashes, checked, ids, components = result
        self.components += components or []
        self.key_names |= ids is not None and keys_are_names(ids, len(self.counts))
        self.counts += counts
        self.masked |= trained is not None
        self.trained.extend([max(n - 1, 0) for n in counts] if trained is None else trained)
        self.checked += checked
        self.hashes += hashes
        self.shards.append(ShardEntry(name, len(counts)))
        return len(counts)
