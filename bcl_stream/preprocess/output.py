"""Output locations: refuse to write over an existing dataset unless told, and never delete
anything that does not look like one of ours.

``--overwrite`` on a local directory removes it only when every entry is a dataset file
(shards, ``index.json``, the cost index, temporaries): pointing ``--output`` at a home
directory by mistake is refused, not obeyed. On S3 the completion markers (``index.json``,
``bcl_index.json``) are deleted first, so a crash during the rewrite leaves a dataset readers
refuse instead of an old index over new shards; stale shards with other names stay (no reader
looks at them) and are listed in the warning.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Collection
from pathlib import Path
from urllib.parse import urlparse

from bcl_stream.errors import DatasetError
from bcl_stream.io.dataset_dir import MDS_INDEX
from bcl_stream.io.index import INDEX_JSON
from bcl_stream.io.remote import is_remote, join, list_remote

DATASET_FILE = re.compile(
    r"^(index\.json|bcl_index\.json|bcl_costs\.npy|bcl_hashes\.npy|bcl_skipped\.txt|shard\.\d+\.mds(\.\w+)?|shard-\d+\.tar(\.gz)?"
    r"|part-\d+-of-\d+|.*\.tmp)$"
)


def _refuse(output: str, found: list[str]) -> DatasetError:
    shown = ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
    return DatasetError(
        f"output {output} already exists and is not empty ({shown}); "
        "pass --overwrite to replace it, or choose another --output"
    )


def remote_listing(output: str) -> list[str]:
    """Object names under a remote dataset location (relative to it); see ``list_remote``."""
    return list_remote(output)


def delete_remote(output: str, names: list[str]) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
    for name in names:
        url = urlparse(join(output, name))
        client.delete_object(Bucket=url.netloc, Key=url.path.lstrip("/"))


def is_complete(names: Collection[str]) -> bool:
    """Whether a dataset's file names include its completion marker: MDS ``index.json``
    (when MDS shards or ``index.json`` are there), else WebDataset's ``bcl_index.json``."""
    if MDS_INDEX in names or any(".mds" in n for n in names):
        return MDS_INDEX in names
    return INDEX_JSON in names


def prepare_output(output: str, *, overwrite: bool, replace_incomplete: bool = False) -> None:
    """Make ``output`` ready for a fresh write, or raise :class:`DatasetError`.

    ``replace_incomplete`` (a part of a partitioned run): an output without its completion
    marker, left by a killed run of the same part, is replaced without ``overwrite`` (the
    write lock, held by the caller, rules out a live writer).
    """
    if is_remote(output):
        found = remote_listing(output)
        if not found:
            return
        if not overwrite and not (replace_incomplete and not is_complete(found)):
            raise _refuse(output, found)
        if not output.startswith("s3://"):
            raise DatasetError(f"--overwrite of {output}: only s3:// outputs can be cleared")
        delete_remote(output, [n for n in (MDS_INDEX, INDEX_JSON) if n in found])
        return
    if check_output(output, overwrite=overwrite, replace_incomplete=replace_incomplete):
        shutil.rmtree(Path(output.removeprefix("file://")))


def check_output(output: str, *, overwrite: bool, replace_incomplete: bool = False) -> bool:
    """Refuse a local ``output`` that cannot be written (a file; not empty without
    ``overwrite``; files that are not a dataset's); True when it holds a dataset to replace.
    Changes nothing, so it runs before any slow step (remote outputs: :func:`prepare_output`)."""
    if is_remote(output):
        return False
    root = Path(output.removeprefix("file://"))
    if root.exists() and not root.is_dir():
        raise DatasetError(f"output {root} is a file, not a directory")
    if not root.is_dir():
        return False
    found = sorted(p.name for p in root.iterdir())
    if not found:
        return False
    if not overwrite and not (replace_incomplete and not is_complete(found)):
        raise _refuse(str(root), found)
    foreign = [n for n in found if not DATASET_FILE.match(n)]
    if foreign:
        raise DatasetError(
            f"--overwrite refused: {root} holds files that are not part of a dataset "
            f"({', '.join(foreign[:5])}); remove them yourself or choose another --output"
        )
    return True


def remove_if_empty(output: str) -> None:
    """Remove a local output directory that holds nothing (what a run that failed before its
    first shard leaves); one with shards stays, visibly incomplete (no index)."""
    if is_remote(output):
        return
    root = Path(output.removeprefix("file://"))
    with contextlib.suppress(OSError):  # not empty, or gone: nothing to do
        root.rmdir()
