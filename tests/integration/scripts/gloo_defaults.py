"""Two real processes, gloo: what readers take from the process group when the caller leaves
the world size or the rank out, and what they refuse. Everything is imported from the public
face ``bcl_stream``.

Usage: python gloo_defaults.py WDS_DIR PORT OUT_JSON. Rank 0 writes, per rank: the error of a
config built without a world size before the group exists, the world size a config built
inside it takes, the rank each reader took (default, explicit, mixture, a data-parallel size
that divides the group), its first pack's record ids, and the refusals of a world size that
contradicts the group.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def refusal(action: object) -> str:
    """The message of the ValueError ``action()`` raises ("" when it raises none)."""
    try:
        action()  # type: ignore[operator]
    except ValueError as exc:
        return str(exc)
    return ""


def first_pack(dataset: object) -> list[int]:
    return [int(r["sample_id"]) for r in next(iter(dataset))]  # type: ignore[call-overload]


def worker(rank: int, root: str, port: int, out: str) -> None:
    from bcl_stream import ReaderConfig, open_dataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("RANK", None)  # the rank must come from the group, not the environment
    before = refusal(lambda: ReaderConfig.build(pack_size=4, window=3))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    config = ReaderConfig.build(pack_size=4, window=3, seed=9)
    default = open_dataset(root, None, config)
    explicit = open_dataset(root, None, config, WORLD - 1 - rank)
    mixture = open_dataset(None, [root], config)
    data_parallel = ReaderConfig.build(world_size=1, pack_size=4, window=3, seed=9)
    shared = open_dataset(root, None, data_parallel, 0)  # a TP group of 2: one data-parallel rank
    mine = {
        "rank": rank,
        "before_group": before,
        "world_size": config.plan.world_size,
        "default_rank": default.rank,
        "default_first": first_pack(default),
        "explicit_rank": explicit.rank,
        "explicit_first": first_pack(explicit),
        "mixture_rank": mixture.rank,
        "shared_rank": shared.rank,
        "contradiction": refusal(
            lambda: open_dataset(
                root, None, ReaderConfig.build(world_size=3, pack_size=4, window=3)
            )
        ),
        "dp_without_rank": refusal(lambda: open_dataset(root, None, data_parallel)),
    }
    gathered: list[object] = [None] * WORLD
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(gathered, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    root, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mp.spawn(worker, args=(root, port, out), nprocs=WORLD, join=True)
