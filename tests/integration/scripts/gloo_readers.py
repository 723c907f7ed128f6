"""Two real processes, gloo: each builds its rank's reader and loader, runs two epochs with a
collective per pack (uneven pack counts would hang or fail), and rank 0 writes what every rank
yielded plus their loader states as JSON.

Usage: python gloo_readers.py MDS_DIR WDS_DIR PORT OUT_JSON (one job, both readers: process
start-up dominates the run time). Output: {"mds": [per rank], "wds": [per rank]}. Set
``BCL_STREAM_KEEP_SHM=1`` where other streaming jobs may be alive (see the job-start cleanup).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def run_reader(fmt: str, root: str) -> list[object]:
    """Two epochs of this rank's loader; returns what every rank yielded (all_gather)."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.loading.loader import PackLoader

    config = ReaderConfig.build(world_size=WORLD, pack_size=4, window=3, seed=9)
    if fmt == "mds":
        from bcl_stream.formats.mds_reader import MDSPackDataset

        dataset = MDSPackDataset(root, config)  # rank from torch.distributed
    else:
        from bcl_stream.formats.wds_reader import WDSPackDataset

        dataset = WDSPackDataset(root, config)
    loader = PackLoader(dataset, num_workers=1)
    epochs = []
    states = []
    for _ in range(2):
        packs = []
        for pack in loader:
            step = torch.ones(1)
            dist.all_reduce(step)  # one collective per micro-batch, as DDP does
            assert int(step.item()) == WORLD
            packs.append([int(s["sample_id"]) for s in pack])
            if len(packs) == 5:
                states.append(loader.state_dict())
        epochs.append(packs)
    gathered: list[object] = [None] * WORLD
    mine = {"rank": dataset.rank, "len": len(loader), "epochs": epochs, "states": states}
    dist.all_gather_object(gathered, mine)
    return gathered


def wrong_world_error(root: str) -> str:
    """A config whose world size differs from the process group must be refused."""
    from bcl_stream.epoch.plan import ReaderConfig
    from bcl_stream.formats.wds_reader import WDSPackDataset

    try:
        WDSPackDataset(root, ReaderConfig.build(world_size=WORLD + 1, pack_size=4, window=3), 0)
    except ValueError as exc:
        return str(exc)
    return ""


def worker(rank: int, mds_root: str, wds_root: str, port: int, out: str) -> None:
    # Streaming reads these; a DDP launcher would set them (set before building: docs/lightning.md).
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    result: dict[str, object] = {
        "mds": run_reader("mds", mds_root),
        "wds": run_reader("wds", wds_root),
        "wrong_world_error": wrong_world_error(wds_root),
    }
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mds_root, wds_root, port, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from bcl_stream.io.streaming_compat import clean_stale_shared_memory_once

    # Once per job, before any process group exists, and skipped under BCL_STREAM_KEEP_SHM=1
    # (the test sets it): streaming's cleanup unlinks the shared memory of every streaming job
    # on the machine, live ones included, such as the test suite of another checkout.
    clean_stale_shared_memory_once()
    mp.spawn(worker, args=(mds_root, wds_root, port, out), nprocs=WORLD, join=True)
