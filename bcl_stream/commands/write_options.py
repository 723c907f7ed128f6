"""Options ``preprocess`` and ``annotate`` share: both cost records under a cost model, may
replace what an earlier run wrote, run worker processes, can be cut into ``--part I/N`` runs
that ``bcl-stream merge`` joins, and draw a progress bar. One declaration, so the two commands
cannot drift apart in spelling or default; what differs (what is replaced, what a worker does,
what a part is) is passed in.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DEFAULT_COST_MODEL = "llama3-8b"
"""The cost model a command uses when none is named (the 8B Llama-3 shape's training FLOPs)."""


def add_write_options(
    p: argparse.ArgumentParser, *, replaces: str, workers: int, workers_help: str, part_help: str
) -> None:
    """``--cost-model``, ``--overwrite`` (of ``replaces``), ``--workers`` (default ``workers``),
    ``--part I/N`` and ``--no-progress``."""
    p.add_argument(
        "--cost-model", default=DEFAULT_COST_MODEL, help="preset name or cost-model JSON"
    )
    p.add_argument("--overwrite", action="store_true", help=f"replace an existing {replaces}")
    p.add_argument("--workers", type=int, default=workers, help=workers_help)
    p.add_argument("--part", default=None, metavar="I/N", help=part_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_processor_option(p: argparse.ArgumentParser, *, does: str) -> None:
    """``--processor DIR``: image-text records encoded through a local Hugging Face processor
    directory, exactly as its processor gives them. ``preprocess`` and ``annotate`` declare it
    here once, so a dataset annotated in place is counted as ``preprocess`` would write it;
    ``does`` says what each command does with the images."""
    p.add_argument(
        "--processor",
        default=None,
        metavar="DIR",
        help="image-text records: a local Hugging Face processor directory (tokenizer, chat "
        "template, preprocessor_config.json); ids are exactly what it gives, image sizes come "
        f"from the headers; {does} (replaces --tokenizer)",
    )


def add_chat_template_options(p: argparse.ArgumentParser, *, renders: str) -> None:
    """``--chat-template FILE`` and ``--chat-template-kwargs JSON``: the template that renders
    conversations instead of the tokenizer directory's own, and its variables. ``preprocess``
    and ``annotate`` declare them once here so a dataset annotated in place renders its
    conversations exactly as ``preprocess`` would have (``RecordSource.from_options`` reads
    them back; the readers re-render with the declared template)."""
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a chat template (Jinja file, or JSON with 'chat_template') that renders "
        f"{renders} instead of the --tokenizer directory's own; needed where it has none",
    )
    p.add_argument(
        "--chat-template-kwargs",
        default=None,
        type=json_object,
        metavar="JSON",
        help="template variables for every record, e.g. '{\"enable_thinking\": false}' "
        "(a record's own chat_template_kwargs take precedence)",
    )


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (argparse ``type=``), or a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value
