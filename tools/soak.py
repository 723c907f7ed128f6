"""Kill-and-resume soak: one 2-rank DDP training job (LightningCLI, gloo, CPU, TinyGPT on a
300-record costed MDS dataset, 2 epochs) SIGKILLed ``--kills`` times at random moments, each
time resumed from the last complete checkpoint, compared with an uninterrupted run.

Kill moments cycle through: a random step mid-epoch, inside a checkpoint save, and a random
moment of start-up or restore; every rank has a persistent DataLoader worker. The harness is the
crash test's (``bcl_bench/soak.py``); this script only adds more kills and writes the result
JSON. The dataset is the test suite's (``tests/conftest.py``: record i holds i), so run it from
the checkout's root:

    python -m tools.soak --kills 10 --seed 1 --out results/soak.json

About 15 s of start-up per resumed process on 2 CPU cores, so 10 kills take ~3-4 minutes.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_bench.soak import reference_run, soak


def main() -> None:
    parser = bench_parser(__doc__, RESULTS / "soak.json")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    args = parser.parse_args()
    try:
        from tests.conftest import write_mds
    except ImportError as exc:
        raise SystemExit(
            "soak writes the test suite's dataset (tests/conftest.py): run it from the "
            "checkout's root as `python -m tools.soak`"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="bcl_soak_") as tmp:
        work = Path(tmp)
        for run in ("ref", "job"):  # the harness writes each run's config into its directory
            (work / run).mkdir()
        data = work / "data"
        write_mds(data, 300)
        t0 = time.monotonic()
        reference = reference_run(data, work / "ref", workers=args.workers)
        seconds_reference = time.monotonic() - t0
        report = soak(data, work / "job", reference, kills=args.kills, seed=args.seed,
                      workers=args.workers)  # fmt: skip
    report = {
        "command": f"python -m tools.soak --kills {args.kills} --seed {args.seed} "
        f"--workers {args.workers}",
        "seconds_reference_run": round(seconds_reference, 1),
        **report,
    }
    write_result(report, args.out)
    keys = ("kills", "kills_by_kind", "kills_inside_a_save_before_its_file_was_written",
            "records_trained", "records_lost", "records_duplicated", "unreadable_checkpoints",
            "seconds_killed_and_resumed_job")  # fmt: skip
    print(json.dumps({k: report[k] for k in keys}))


if __name__ == "__main__":
    main()
