"""Two real processes, gloo: each builds its rank's reader and loader, runs two epochs with a
collective per pack (uneven pack counts would hang or fail), and rank 0 writes what every rank
yielded plus their loader states as JSON.

It also checks what readers take from the process group when the caller leaves the world
size or the rank out (``defaults``, through the public face ``bcl_stream``): the error of a
config built without a world size before the group exists, the world size one built inside it
takes, the rank each reader took (default, explicit, mixture, a data-parallel size that
divides the group), first packs, and the refusals of a world size that contradicts the group.

Usage: python gloo_readers.py MDS_DIR WDS_DIR PORT OUT_JSON (one job, both readers: process
start-up dominates the run time). Output: {"mds": [per rank], "wds": [per rank], "defaults":
[per rank], ...}. Set ``BCL_STREAM_KEEP_SHM=1`` where other streaming jobs may be alive (see
the job-start cleanup).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

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


def refusal(action: Callable[[], object]) -> str:
    """The message of the ValueError ``action()`` raises ("" when it raises none)."""
    try:
        action()
    except ValueError as exc:
        return str(exc)
    return ""


def first_pack(dataset: Iterable[list[dict[str, Any]]]) -> list[int]:
    return [int(r["sample_id"]) for r in next(iter(dataset))]


def defaults(root: str, before_group: str) -> list[object]:
    """World size and rank left out, inside the group (WebDataset: no streaming, so env
    ``RANK`` can be taken away to show the rank comes from the group)."""
    from bcl_stream import ReaderConfig, open_dataset

    rank_env = os.environ.pop("RANK")
    config = ReaderConfig.build(pack_size=4, window=3, seed=9)
    default = open_dataset(root, config)
    explicit = open_dataset(root, config, WORLD - 1 - dist.get_rank())
    data_parallel = ReaderConfig.build(world_size=1, pack_size=4, window=3, seed=9)
    contradiction = ReaderConfig.build(world_size=WORLD + 1, pack_size=4, window=3)
    mine = {
        "rank": dist.get_rank(),
        "before_group": before_group,
        "world_size": config.plan.world_size,
        "ranks_per_node": config.plan.ranks_per_node,  # LOCAL_WORLD_SIZE, as torchrun sets it
        "default_rank": default.rank,
        "default_first": first_pack(default),
        "explicit_rank": explicit.rank,
        "explicit_first": first_pack(explicit),
        "mixture_rank": open_dataset([root], config).rank,
        "shared_rank": open_dataset(root, data_parallel, 0).rank,  # TP group of 2
        "contradiction": refusal(lambda: open_dataset(root, contradiction)),
        "dp_without_rank": refusal(lambda: open_dataset(root, data_parallel)),
    }
    os.environ["RANK"] = rank_env
    gathered: list[object] = [None] * WORLD
    dist.all_gather_object(gathered, mine)
    return gathered


def worker(rank: int, mds_root: str, wds_root: str, port: int, out: str) -> None:
    from bcl_stream import ReaderConfig

    before_group = refusal(lambda: ReaderConfig.build(pack_size=4, window=3))
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
        "defaults": defaults(wds_root, before_group),
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
    # Forked, not spawned: two real processes as before, each its own gloo rank (no process
    # group exists yet here, and this process starts no thread), without a new interpreter
    # importing torch and streaming again for each rank.
    mp.start_processes(
        worker, args=(mds_root, wds_root, port, out), nprocs=WORLD, join=True, start_method="fork"
    )
