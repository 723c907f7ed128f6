"""``bcl-stream read``: the record ids rank r's real loader yields.

Same code path as training: ``MDSPackDataset``/``WDSPackDataset`` + ``PackLoader`` with
``--num-workers`` DataLoader workers. ``--json`` also reports time to the first pack,
records/s and peak memory (:func:`read_figures`). ``--start-after N`` reads N packs, takes the loader's
``state_dict()`` through JSON, and resumes a fresh loader from it, as a restarted job would.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from itertools import islice
from typing import Any

from bcl_stream.commands.plan import (
    add_plan_options,
    cache_dir,
    config_from_args,
    data_source,
    open_plan_data,
)
from bcl_stream.epoch.canonical import plan_for
from bcl_stream.epoch.checks import require_packs
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.process_layout import ProcessLayout


def add_parser(sub: Any) -> None:
    p = sub.add_parser("read", help="print the packs rank r's loader yields (real reader)")
    add_plan_options(p)
    p.add_argument("--rank", type=int, required=True, help="the rank whose loader is read")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--persistent-workers", action="store_true", help="keep workers alive between epochs"
    )
    p.add_argument("--packs", type=int, default=None, help="stop after N packs (default: epoch)")
    p.add_argument(
        "--start-after", type=int, default=None, help="resume from a state saved after N packs"
    )
    p.set_defaults(run=run)


def read_figures(
    packs: list[list[Any]], started: float, first_pack: float | None, done: float
) -> dict[str, Any]:
    """What a user judges a loader by: seconds from the command's start (its options parsed;
    importing torch and the reader, opening the data and planning included) to the first pack, records per second over the whole read and
    after the first pack, and peak resident memory of this process and of its largest
    DataLoader worker (ended workers only: ``persistent`` ones are still running)."""
    records = sum(len(p) for p in packs)
    rate_after = None
    if first_pack is not None and done > first_pack and len(packs) > 1:
        rate_after = round((records - len(packs[0])) / (done - first_pack), 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "records": records,
        "seconds": round(done - started, 4),
        "first_pack_seconds": None if first_pack is None else round(first_pack - started, 4),
        "records_per_second": round(records / (done - started), 1) if done > started else None,
        "records_per_second_after_first_pack": rate_after,
        "peak_rss_mb": round(rss, 1),
        "worker_peak_rss_mb": round(workers, 1) if workers else None,
    }


def check_usage(args: argparse.Namespace) -> ReaderConfig:
    """Every check that needs neither torch nor streaming (seconds of imports), made first: the
    options, the rank, the data's cost index and scope, and a plan with at least one pack."""
    for name in ("packs", "start_after", "num_workers"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    config = config_from_args(args)
    if not 0 <= args.rank < config.plan.world_size:
        raise ValueError(
            f"--rank must be in [0, {config.plan.world_size}) for --world-size "
            f"{config.plan.world_size}, got {args.rank}"
        )
    index, location = open_plan_data(args)
    plan = plan_for(index, config, args.epoch)
    require_packs(location, plan, config, len(index))  # type: ignore[arg-type]
    return config


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    config = check_usage(args)
    from bcl_stream.formats.open_dataset import open_dataset
    from bcl_stream.loading.loader import PackLoader

    location, specs = data_source(args)
    places = [location] if specs is None else [spec.path for spec in specs]
    dataset = open_dataset(
        location if specs is None else specs,
        config,
        args.rank,
        cache_dir(args, *(p for p in places if p is not None)),
        epoch_size=args.epoch_size,
    )

    def loader() -> PackLoader:
        persistent = args.persistent_workers and args.num_workers > 0
        return PackLoader(dataset, num_workers=args.num_workers, persistent_workers=persistent)

    first = loader()
    first.set_epoch(args.epoch)  # the loader owns the cursor: it is moved through it only
    if args.start_after:
        it = iter(first)
        taken = sum(1 for _ in islice(it, args.start_after))
        if taken < args.start_after:
            raise ValueError(
                f"--start-after {args.start_after} is past the epoch end ({taken} packs per rank)"
            )
        state = json.loads(json.dumps(first.state_dict()))
        del it
        first = loader()
        first.load_state_dict(state)
    packs: list[list[Any]] = []
    first_pack: float | None = None
    for pack in islice(first, args.packs):
        if first_pack is None:
            first_pack = time.perf_counter()
        packs.append(
            [
                [int(s["stream"]), int(s["sample_id"])] if "stream" in s else int(s["sample_id"])
                for s in pack
            ]
        )
    done = time.perf_counter()
    pc = config.plan
    layout = ProcessLayout.of_plan(pc)
    if args.json:
        timing = read_figures(packs, started, first_pack, done)
        print(json.dumps({"rank": args.rank, **layout.to_json(), **timing, "packs": packs}))
    else:
        # The set-up on stderr: stdout stays one pack per line, to diff against plan.
        print(
            f"rank {args.rank} of {pc.world_size} (node {args.rank // pc.ranks_per_node}): "
            f"{len(packs)} packs of {pc.pack_size} records; node layout: {layout.text()}",
            file=sys.stderr,
        )
        for pack in packs:
            print(" ".join(map(str, pack)))
    return 0
