"""``bcl-stream annotate``: add a cost index to an existing MDS or WebDataset directory."""

from __future__ import annotations

import argparse
from typing import Any

from bcl_stream.commands.write_options import (
    add_chat_template_options,
    add_processor_option,
    add_write_options,
)
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.records.source import RecordSource
from bcl_stream.text.templates import LOSS_ON


def add_parser(sub: Any) -> None:
    p = sub.add_parser("annotate", help="add a cost index to an existing dataset (no rewrite)")
    p.add_argument(
        "directory",
        metavar="DIR",
        help="MDS or WebDataset directory, or s3:// URL. With no column named: stored "
        "input_ids, else the layout preprocess recognises (a text column, messages or "
        "conversations, prompt + response or completion; text needs --tokenizer)",
    )
    p.add_argument(
        "--tokens-field",
        default="input_ids",
        help="column/member of token ids (an integer array, or raw bytes with --tokens-dtype)",
    )
    p.add_argument(
        "--tokens-dtype",
        default=None,
        help="integer dtype of a raw-bytes token column (int64 for llm-foundry's 'tokens')",
    )
    p.add_argument(
        "--text-field",
        default=None,
        help="a text column/member to tokenize instead (with --tokenizer)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="with --text-field or --messages-field, or alone for a layout found by name: "
        "cl100k, a local tokenizer.json or Hugging Face tokenizer dir",
    )
    p.add_argument(
        "--response-field",
        default=None,
        metavar="NAME",
        help="prompt/response records: the response column (the prompt is --tokens-field or "
        "--text-field); readers yield prompt + response ids with the response trained "
        "(llm-foundry's prompt/response text columns are found without it: --tokenizer DIR; "
        "its pre-tokenized input_ids + labels: --response-field labels)",
    )
    p.add_argument(
        "--length-field",
        default=None,
        help="integer length column instead (checked against the token column on a sample)",
    )
    p.add_argument(
        "--messages-field",
        default=None,
        metavar="NAME",
        help="a conversation column/json key, rendered with --tokenizer's chat template (or "
        "the built-in ChatML) on every read, as preprocess renders it",
    )
    add_chat_template_options(p, renders="a --messages-field conversation")
    add_processor_option(
        p,
        does="an img2dataset WebDataset (image + txt caption + json: the caption trained as "
        "the answer) or MDS image columns are counted in place, their cost components "
        "written beside the index, and the readers encode each record alike",
    )
    p.add_argument(
        "--loss-on",
        choices=LOSS_ON,
        default=None,
        help="with --messages-field: the trained tokens (default assistant)",
    )
    add_write_options(
        p,
        replaces="cost index",
        workers=1,
        workers_help="processes decoding shards (same index for any)",
        part_help="count only the I-th of N runs of shards, into DIR/part-I-of-N (then "
        "`bcl-stream merge DIR`)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.processor is not None and args.tokenizer is not None:
        raise ValueError("--processor replaces --tokenizer (its tokenizer is the processor's)")
    if (args.text_field is not None or args.messages_field is not None) and args.tokenizer is None:
        raise ValueError(
            "--text-field and --tokenizer go together (a text column is tokenized); so do "
            "--messages-field and --tokenizer (a conversation is rendered)"
        )
    index = annotate(
        args.directory,
        source=RecordSource.from_options(vars(args)),
        length_field=args.length_field,
        cost_model=args.cost_model,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        workers=args.workers,
        part=args.part,
    )
    summary = index.summary()
    tokens = summary["tokens"]
    where = args.directory if args.part is None else f"{args.directory} part {args.part}"
    print(
        f"annotated {where}: {len(index)} records in {len(index.shards)} {index.format} "
        f"shards, {tokens['total']:.0f} tokens (mean {tokens['mean']:.1f}, max {tokens['max']:.0f}), "
        f"cost model {index.cost_model.name}, {summary['trained']['total']:.0f} trained tokens"
    )
    counted = index.extra.get("annotate", {})
    if "length_field" in counted:
        checked = index.extra.get("length_check", {}).get("records", 0)
        print(
            f"length field {counted['length_field']!r} checked against the token column on "
            f"{checked} records"
            if checked
            else f"length field {counted['length_field']!r} not checked: the records have no "
            "token column to compare with (the readers need one: --tokens-field or --text-field)"
        )
    return 0
