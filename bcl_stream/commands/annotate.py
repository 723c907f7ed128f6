"""``bcl-stream annotate``: add a cost index to an existing MDS or WebDataset directory."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("annotate", help="add a cost index to an existing dataset (no rewrite)")
    p.add_argument("directory", metavar="DIR", help="MDS or WebDataset directory, or s3:// URL")
    p.add_argument("--tokens-field", default="input_ids", help="column/member of token ids")
    p.add_argument("--length-field", default=None, help="integer length column instead")
    p.add_argument("--cost-model", default="llama3-8b", help="preset name or cost-model JSON")
    p.add_argument("--overwrite", action="store_true", help="replace an existing cost index")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bcl_stream.preprocess.annotate import annotate

    index = annotate(
        args.directory,
        tokens_field=args.tokens_field,
        length_field=args.length_field,
        cost_model=args.cost_model,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    tokens = index.summary()["tokens"]
    print(
        f"annotated {args.directory}: {len(index)} records in {len(index.shards)} {index.format} "
        f"shards, {tokens['total']:.0f} tokens (mean {tokens['mean']:.1f}, max {tokens['max']:.0f}), "
        f"cost model {index.cost_model.name}"
    )
    return 0
