"""Remote datasets for ``annotate`` and ``inspect``: copy down, work locally, push the index.

Both commands need every shard (``annotate`` reads the token ids, ``inspect`` counts tar members),
so a remote dataset is downloaded whole into a temporary directory with streaming's downloaders
(``bcl_stream.io.remote.download``). ``annotate`` then uploads ``bcl_costs.npy``,
``bcl_index.json`` and, for MDS, ``index.json`` with the pointer key, in that order.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from bcl_stream.errors import DatasetError
from bcl_stream.io.dataset_dir import MDS_INDEX, WDS_SUFFIXES, read_mds_index
from bcl_stream.io.index import INDEX_FILES, INDEX_JSON
from bcl_stream.io.names import check_name, path_under
from bcl_stream.io.remote import download, join, upload, upload_index
from bcl_stream.preprocess.output import remote_listing


def fetch_dataset(location: str, local: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """Download a remote MDS or WebDataset dataset (and its cost index, if any) into ``local``.

    Missing shards are left missing (``inspect`` reports them), not an error here.
    """
    root = Path(local)
    names = set(remote_listing(location))
    if not names:
        raise DatasetError(f"{location}: no such dataset (nothing stored under it)")
    wanted = [n for n in INDEX_FILES if n in names]
    if MDS_INDEX in names:
        download(join(location, MDS_INDEX), root / MDS_INDEX)
        try:
            entries = read_mds_index(root)["shards"]
        except DatasetError as exc:  # named by the dataset's URL, not the local copy
            raise type(exc)(str(exc).replace(str(root), location)) from exc
        for shard in entries:
            raw, zipped = (
                shard["raw_data"]["basename"],
                (shard.get("zip_data") or {}).get("basename"),
            )
            wanted.append(raw if raw in names or not zipped else zipped)
    else:
        wanted += sorted(n for n in names if n.endswith(WDS_SUFFIXES) and "/" not in n)
        wanted += _indexed_subdir_shards(location, root, names)
    wanted = [n for n in wanted if n in names]
    # Every target is checked before the first download: a name from an index that climbs
    # out of ``local`` is refused, and nothing of the dataset is fetched.
    targets = [path_under(root, n, f"{location}: shard {n!r}", writing=True) for n in wanted]
    # Each download builds its own client (~0.3 s here): overlap them.
    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = [
            pool.submit(download, join(location, n), t)
            for n, t in zip(wanted, targets, strict=True)
        ]
        for job in tqdm(jobs, desc="download", unit="file", disable=not progress):
            job.result()
    return root


def _indexed_subdir_shards(location: str, root: Path, names: set[str]) -> list[str]:
    """WebDataset shards in sub-directories that the cost index lists (a merged dataset's
    ``part-I-of-N/shard-*.tar``); a damaged index lists none here and is reported later."""
    if INDEX_JSON not in names:
        return []
    download(join(location, INDEX_JSON), root / INDEX_JSON)
    try:
        shards = json.loads((root / INDEX_JSON).read_text())["shards"]
        found = [s["name"] for s in shards if "/" in s["name"]]
    except (ValueError, KeyError, TypeError):
        return []
    where = f"{location}: {INDEX_JSON}"
    return sorted({check_name(n, "shard", f"{where} shard {n!r}") for n in found})


def push_index(root: Path, location: str) -> None:
    """Upload the cost index, then (MDS) ``index.json``: the completion marker goes last."""
    upload_index(root, location)
    if (root / MDS_INDEX).is_file():
        upload(root / MDS_INDEX, location, MDS_INDEX)
