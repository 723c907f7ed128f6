"""``bcl-stream merge``: join the parts of a partitioned preprocess or annotate run."""

from __future__ import annotations

import argparse
from typing import Any

from bcl_stream.preprocess.merge import merge


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "merge", help="join OUTPUT/part-I-of-N datasets into one dataset at OUTPUT (no copy)"
    )
    p.add_argument("output", metavar="OUTPUT", help="the --output of the parts (dir or s3://)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    index = merge(args.output)
    parts = index.extra["merge"]["parts"]
    print(
        f"merged {len(parts)} parts into {args.output}: {len(index)} records in "
        f"{len(index.shards)} {index.format} shards, cost model {index.cost_model.name}"
    )
    return 0
