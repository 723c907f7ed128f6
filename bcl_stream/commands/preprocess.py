"""``bcl-stream preprocess``: JSONL/Parquet -> tokenized, costed MDS or WebDataset shards."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.preprocess.outliers import POLICIES


def add_parser(sub: Any) -> None:
    p = sub.add_parser("preprocess", help="tokenize JSONL/Parquet into costed MDS or WDS shards")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or Parquet files")
    p.add_argument("--output", required=True, help="output directory or s3:// URL")
    p.add_argument(
        "--format", choices=["mds", "wds"], default="mds", help="MDS (all scopes) or WebDataset"
    )
    p.add_argument("--text-field", default="text", help="text field (else chat 'messages')")
    p.add_argument("--tokenizer", default="cl100k", help="cl100k or a local tokenizer.json")
    p.add_argument("--cost-model", default="llama3-8b", help="preset name or cost-model JSON")
    p.add_argument(
        "--max-record-tokens",
        type=int,
        default=None,
        help="longest record kept as is; longer ones follow --outliers",
    )
    p.add_argument(
        "--outliers",
        choices=POLICIES,
        default="error",
        help="what to do with a record above --max-record-tokens",
    )
    p.add_argument(
        "--skip-bad", action="store_true", help="skip and count bad records and empty input files"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--workers", type=int, default=2, help="tokenizer processes")
    p.add_argument(
        "--shard-size-limit", default="64mb", help="bytes per shard (MDS size_limit, WDS maxsize)"
    )
    p.add_argument("--compression", default=None, help="MDS: zstd, gz, ...; WDS: gz")
    p.add_argument("--maxcount", type=int, default=10_000, help="WDS: records per shard")
    p.add_argument(
        "--part",
        default=None,
        metavar="I/N",
        help="write only the I-th of N shares of the inputs, under OUTPUT/part-I-of-N "
        "(then `bcl-stream merge OUTPUT`)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bcl_stream.preprocess import preprocess
    from bcl_stream.preprocess.pipeline import parse_size

    report = preprocess(
        args.inputs,
        args.output,
        format=args.format,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        cost_model=args.cost_model,
        max_record_tokens=args.max_record_tokens,
        outliers=args.outliers,
        skip_bad=args.skip_bad,
        overwrite=args.overwrite,
        workers=args.workers,
        shard_size_limit=parse_size(args.shard_size_limit),
        compression=args.compression,
        maxcount=args.maxcount,
        progress=not args.no_progress,
        part=args.part,
    )
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print("\n".join(report.lines()))
    return 0
