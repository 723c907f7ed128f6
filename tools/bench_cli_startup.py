"""Benchmark: wall time of ``bcl-stream`` commands from process start to exit.

The issue's target: ``bcl-stream --help``, ``plan``, ``simulate`` and ``inspect --json`` on a
local dataset start (and here finish: the dataset is small) in <= 1.5 s, because they import
neither streaming nor torch. ``read`` and ``annotate`` on MDS are timed too, for reference:
they need streaming (MDS decoding), whose import is most of their time.

Usage errors (issue "the user's path, second pass", point 8: every usage error in <= 1 s):
``read`` with a rank outside the world, ``read`` with a pack size larger than the data,
``preprocess`` onto an existing output, and ``python -m lightning_module fit`` with a dataset
path or a checkpoint that does not exist. Each must exit 2, before torch, streaming or
Lightning is imported (``tests/integration/test_usage_errors.py`` checks the imports).

Each command runs ``--repeats`` times in a fresh ``python -m bcl_stream.cli`` process,
commands interleaved so machine load hits them alike; the median is kept. The dataset is a
costed MDS dataset of ``--records`` short records written once into a temporary directory.
Also recorded: ``python -c pass`` (the interpreter alone) and ``import streaming``.

Output: ``results/bench_cli_startup.json``.

Usage::

    python tools/bench_cli_startup.py [--repeats 5] [--records 2000]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bcl_bench.harness import RESULTS, ROOT, bench_parser, checkout_env, write_result

TARGET_S = 1.5
FAST = ("help", "plan", "simulate", "inspect_json")
USAGE_TARGET_S = 1.0
USAGE_ERRORS = (
    "read_bad_rank",
    "read_no_pack",
    "preprocess_existing_output",
    "lightning_missing_data",
    "lightning_missing_ckpt",
)


def write_dataset(root: Path, records: int) -> None:
    from bcl_stream.formats.mds_writer import CostedMDSWriter

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3.0, 0.9, records).astype(np.int64), 1, 512)
    with CostedMDSWriter(str(root), cost_model="llama3-8b", size_limit=1 << 16) as writer:
        for i, n in enumerate(lengths):
            writer.write({"input_ids": np.full(int(n), i % 50_000, dtype=np.uint32)})


def timed(argv: list[str], code: int = 0) -> float:
    """Wall seconds of one run, which must exit with ``code``."""
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != code:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_cli_startup.json")
    parser.add_argument("--repeats", type=int, default=5, help="runs per command")
    parser.add_argument("--records", type=int, default=2000, help="records in the dataset")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bcl_bench_cli_"))
    try:
        data = tmp / "mds"
        write_dataset(data, args.records)
        plain = tmp / "plain"  # the same shards without a cost index, for annotate
        shutil.copytree(data, plain)
        cli = [sys.executable, "-m", "bcl_stream.cli"]
        plan = ["--world-size", "8", "--pack-size", "8", "--window", "16"]
        commands = {
            "python_only": [sys.executable, "-c", "pass"],
            "import_streaming": [sys.executable, "-c", "import streaming"],
            "help": [*cli, "--help"],
            "plan": [*cli, "plan", str(data), *plan, "--json"],
            "simulate": [*cli, "simulate", "--dataset", str(data), "--json"],
            "inspect_json": [*cli, "inspect", str(data), "--json"],
            "read": [*cli, "read", str(data), *plan, "--rank", "0", "--packs", "4"],
            "annotate": [*cli, "annotate", str(plain), "--overwrite", "--no-progress"],
        }
        jsonl = tmp / "a.jsonl"
        jsonl.write_text('{"text": "a"}\n')
        fit = [sys.executable, "-m", "lightning_module", "fit", "--config"]
        fit.append(str(ROOT / "configs" / "cpu_demo.yaml"))
        commands.update(
            read_bad_rank=[*cli, "read", str(data), *plan, "--rank", "8"],
            read_no_pack=[
                *cli,
                "read",
                str(data),
                *plan[:2],
                "--pack-size",
                "100000",
                "--window",
                "1",
                "--rank",
                "0",
            ],
            preprocess_existing_output=[*cli, "preprocess", str(jsonl), "--output", str(data)],
            lightning_missing_data=[*fit, "--data.data", str(tmp / "missing")],
            lightning_missing_ckpt=[
                *fit,
                "--data.data",
                str(data),
                "--ckpt_path",
                str(jsonl) + "x",
            ],
        )
        codes = {name: 2 if name in USAGE_ERRORS else 0 for name in commands}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, argv in commands.items():  # warm the file cache once
            timed(argv, codes[name])
        for _ in range(args.repeats):
            for name, argv in commands.items():
                times[name].append(timed(argv, codes[name]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    median = {name: statistics.median(ts) for name, ts in times.items()}
    result = {
        "target_seconds": TARGET_S,
        "target_commands": list(FAST),
        "target_met": all(median[name] <= TARGET_S for name in FAST),
        "usage_error_target_seconds": USAGE_TARGET_S,
        "usage_errors": list(USAGE_ERRORS),
        "usage_error_target_met": all(median[name] <= USAGE_TARGET_S for name in USAGE_ERRORS),
        "median_seconds": median,
        "runs_seconds": times,
        "records": args.records,
        "repeats": args.repeats,
    }
    write_result(result, args.out)
    for name, seconds in median.items():
        mark = " (target)" if name in FAST else " (usage error)" if name in USAGE_ERRORS else ""
        print(f"{name:<18}{seconds:7.2f} s{mark}")
    print(
        f"target <= {TARGET_S} s for {', '.join(FAST)}: {'met' if result['target_met'] else 'NOT met'}"
    )
    met = "met" if result["usage_error_target_met"] else "NOT met"
    print(f"usage errors <= {USAGE_TARGET_S} s: {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
