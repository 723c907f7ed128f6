"""What ``annotate`` must know about a WebDataset tar beyond its records: its link members and
what its record keys stand for.

Two stock layouts the readers could not read as ``annotate`` passed them:

- **links.** A tar may hold a symbolic or hard link as a member (``tar`` stores a second name
  of one file as a hard link by default). Every WebDataset reader (ours, and ``webdataset``'s
  ``tar_file_iterator``) reads regular files only, so a record made of links was counted out of
  the dataset without a word. ``annotate`` now refuses such a tar in one line naming the shard
  and the member, and how to rewrite it (the file stored itself).
- **all-digit keys with gaps.** The readers take an all-digit key (``0000000042``) as the global
  record id ``preprocess`` writes, and refuse a record whose key is another number ("shards
  renamed or reordered?"). A filtered corpus written by ``webdataset.TarWriter`` keeps its
  original numbers (``000000``, ``000003``, ...): names, not ids. ``annotate`` records that the
  keys are names (``extra.record_keys = "names"``) when any all-digit key is not its record's
  global id, and the readers then do not read ids from the keys; the record hashes ``annotate``
  stores still catch shards that are swapped or changed.

Both are read from the tar headers alone (``tarfile`` seeks over the payloads of an
uncompressed tar), once per shard.
"""

from __future__ import annotations

import tarfile
from array import array
from pathlib import Path

from bcl_stream.errors import DatasetError
from bcl_stream.formats.tar_scan import split_member

RECORD_KEYS = "record_keys"
"""Key of the cost index's ``extra``: ``"names"`` when the record keys are not record ids."""
NAMES = "names"
NOT_AN_ID = -1
"""What :func:`key_ids` gives a record whose key is not all digits."""


def key_ids(path: Path, name: str) -> array[int]:
    """Per record of the tar at ``path`` (consecutive members with one key, in file order): the
    number its all-digit key spells, or :data:`NOT_AN_ID`. A link member is refused in one
    :class:`DatasetError` naming the shard (``name``) and the member."""
    ids = array("q")
    previous: str | None = None
    try:
        with tarfile.open(path, mode="r:*") as tar:
            for info in tar:
                if info.issym() or info.islnk():
                    kind = "symbolic link" if info.issym() else "hard link"
                    raise DatasetError(
                        f"{name}: member {info.name!r} is a {kind} (to {info.linkname!r}): "
                        "WebDataset readers read regular files only, so its record would be "
                        "dropped without a word. Rewrite the shard with the files themselves "
                        "(for example `tar --dereference --hard-dereference -cf ...`), then "
                        "annotate again"
                    )
                if not info.isreg():
                    continue
                key = split_member(info.name)[0]
                if key != previous:
                    base = key.rsplit("/", 1)[-1]
                    ids.append(int(base) if base.isdigit() else NOT_AN_ID)
                    previous = key
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(
            f"{name}: unreadable tar shard ({type(exc).__name__}: {exc}); re-download or "
            "rewrite the shard"
        ) from exc
    return ids


def keys_are_names(ids: array[int], first: int) -> bool:
    """Whether some all-digit key of a shard whose records start at global id ``first`` is not
    its record's id (so the keys are names, not the ids ``preprocess`` writes)."""
    return any(k != NOT_AN_ID and k != first + i for i, k in enumerate(ids))
