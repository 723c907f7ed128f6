"""``bcl-stream``: the command line. One module per subcommand in ``bcl_stream.commands``.

Each command module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Commands
import heavy libraries (streaming, torch) inside ``run`` so ``bcl-stream --help`` stays fast.
Our own errors (:class:`BCLStreamError`, ``ValueError`` from argument checks) print as one
line on stderr with exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from bcl_stream.errors import BCLStreamError

COMMANDS = ["simulate", "plan", "read", "calibrate", "preprocess", "annotate", "inspect"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcl-stream",
        description="Batch Cost Lookahead: balanced fixed-size packs for distributed training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"bcl_stream.commands.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (BCLStreamError, ValueError, FileNotFoundError) as exc:
        print(f"bcl-stream {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
