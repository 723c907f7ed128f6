"""Read one epoch of a remote MDS dataset in this process; used by the leftovers test.

Usage: ``python read_remote.py URL CACHE_DIR MODE`` with MODE one of
- ``hang``: read 5 packs with 2 workers, print ``READY``, then sleep (to be SIGKILLed);
- ``plain``: read the whole epoch, no cleanup first;
- ``job``: the job-start cleanup (``clean_stale_shared_memory_once``) first, then read.
Prints one JSON line: ``{"packs": [[ids...], ...]}`` or ``{"error": type, "message": ...}``.
"""

from __future__ import annotations

import json
import sys
import time

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import BCLStreamError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.loading.loader import PackLoader

CONFIG = ReaderConfig.build(world_size=1, pack_size=4, window=2, seed=3, shard_group=2)


def main(url: str, cache: str, mode: str) -> None:
    if mode == "job":
        from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once

        clean_stale_shared_memory_once()
    try:
        dataset = MDSPackDataset(url, CONFIG, 0, cache_dir=cache)
        loader = PackLoader(dataset, num_workers=2 if mode == "hang" else 0)
        packs = []
        for pack in loader:
            packs.append([int(s["sample_id"]) for s in pack])
            if mode == "hang" and len(packs) == 5:
                print("READY", flush=True)
                time.sleep(600)
    except BCLStreamError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return
    print(
        json.dumps({"packs": packs, "plan": dataset.epoch_plan(0).rank_packs(0).tolist()}),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
