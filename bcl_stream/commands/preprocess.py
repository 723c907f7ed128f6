"""``bcl-stream preprocess``: JSONL/Parquet -> tokenized, costed MDS or WebDataset shards."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bcl_stream.commands.write_options import (
    add_chat_template_options,
    add_processor_option,
    add_write_options,
)
from bcl_stream.formats.shard_limits import SHARD_RECORDS
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.distributed import preprocess_parts
from bcl_stream.preprocess.outliers import POLICIES
from bcl_stream.preprocess.pipeline import DEFAULT_WORKERS, parse_size
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import LOSS_ON


def add_parser(sub: Any) -> None:
    p = sub.add_parser("preprocess", help="tokenize JSONL/Parquet into costed MDS or WDS shards")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or Parquet files")
    p.add_argument("--output", required=True, help="output directory or s3:// URL")
    p.add_argument(
        "--format", choices=["mds", "wds"], default="mds", help="MDS (all scopes) or WebDataset"
    )
    _add_source_options(p)
    _add_record_limit_options(p)
    _add_shard_options(p)
    _add_engine_options(p)
    add_write_options(
        p,
        replaces="output",
        workers=DEFAULT_WORKERS,
        workers_help="tokenizer processes (the default is the fastest measured on a 2-core "
        "machine; with free cores more may be faster: tools/bench_sft_preprocess.py measures)",
        part_help="write only the I-th of N shares of the inputs, under OUTPUT/part-I-of-N "
        "(then `bcl-stream merge OUTPUT`)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=run)


def _add_source_options(p: argparse.ArgumentParser) -> None:
    """How records are read and tokenized: the fields, the tokenizer or processor, the chat
    template and which tokens are trained (``RecordSource.from_options`` reads them back)."""
    p.add_argument(
        "--text-field",
        default="text",
        help="text field (else a conversation, else prompt + response/completion)",
    )
    p.add_argument(
        "--messages-field",
        default=None,
        metavar="NAME",
        help="the conversation field (default: 'messages' or 'conversations'; ShareGPT "
        "from/value messages are read too)",
    )
    p.add_argument(
        "--tokenizer",
        default="cl100k",
        help="cl100k, a local tokenizer.json, or a local Hugging Face tokenizer directory "
        "(its chat template renders conversations)",
    )
    add_processor_option(p, does="images are stored in the shards")
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        metavar="N",
        help="with --processor: images above N pixels are bad records (default: PIL's "
        "decompression-bomb limit, 89,478,485)",
    )
    add_chat_template_options(p, renders="conversations")
    p.add_argument(
        "--loss-on",
        choices=LOSS_ON,
        default="assistant",
        help="trained tokens of a conversation, stored as its loss mask: every assistant "
        "turn, the last one, or all tokens (prompt/response: the response unless all)",
    )


def _add_record_limit_options(p: argparse.ArgumentParser) -> None:
    """What happens to a record that is too long (the outlier policy) or bad."""
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
        "--skip-bad",
        action="store_true",
        help="skip bad records (counted; the first few named, all listed in bcl_skipped.txt) "
        "and empty input files",
    )


def _add_shard_options(p: argparse.ArgumentParser) -> None:
    """How big the written shards are, and how they are compressed."""
    p.add_argument(
        "--shard-size-limit", default="64mb", help="bytes per shard (MDS size_limit, WDS maxsize)"
    )
    p.add_argument("--compression", default=None, help="MDS: zstd, gz, ...; WDS: gz")
    p.add_argument(
        "--shard-records",
        "--maxcount",
        dest="maxcount",
        metavar="N",
        type=int,
        default=SHARD_RECORDS,
        help="records per shard, both formats (a shard also closes at --shard-size-limit): "
        "planning deals whole shards to nodes, so every node needs many",
    )


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """Where the work runs: this machine, or ``--parts N`` tasks on a Ray cluster."""
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this machine; ray: --parts N tasks on the Ray cluster ray.init() finds "
        "(RAY_ADDRESS), then merge (needs bcl-stream[ray])",
    )
    p.add_argument("--parts", type=int, default=None, metavar="N", help="with --engine ray")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "format": args.format,
        "source": RecordSource.from_options({**vars(args), "processor": None}),  # given apart
        "processor": args.processor,
        "max_image_pixels": args.max_image_pixels,
        "cost_model": args.cost_model,
        "max_record_tokens": args.max_record_tokens,
        "outliers": args.outliers,
        "skip_bad": args.skip_bad,
        "overwrite": args.overwrite,
        "workers": args.workers,
        "shard_size_limit": parse_size(args.shard_size_limit),
        "compression": args.compression,
        "maxcount": args.maxcount,
    }


def _run_parts(args: argparse.Namespace) -> int:
    if args.engine != "ray" or args.parts is None or args.part is not None:
        given = (
            "--parts without --engine ray"
            if args.engine != "ray"
            else (
                "--engine ray without --parts N"
                if args.parts is None
                else "--part with --engine ray"
            )
        )
        raise ValueError(
            f"{given}: --engine ray --parts N runs all N parts on Ray; to run one part "
            "yourself (a Slurm array task), pass --part I/N without --engine"
        )
    run = preprocess_parts(args.inputs, args.output, parts=args.parts, **_options(args))
    index = run.index
    summary = {
        "output": args.output,
        "parts": args.parts,
        "parts_run": sorted(run.reports),
        "parts_skipped_complete": list(run.skipped),
        "records_written": len(index),
        "shards": len(index.shards),
        "preprocess": index.extra.get("preprocess"),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {len(index)} records in {len(index.shards)} {index.format} shards to "
            f"{args.output}: {len(run.reports)} parts run on Ray, {len(run.skipped)} already "
            f"complete, merged"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.engine == "ray" or args.parts is not None:
        return _run_parts(args)
    report = preprocess(
        args.inputs,
        args.output,
        progress=not args.no_progress,
        part=args.part,
        **_options(args),
    )
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print("\n".join(report.lines()))
    return 0
