"""``bcl-stream``: the command line. One module per subcommand in ``bcl_stream.commands``.

Each command module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Commands
import heavy libraries (streaming, torch) inside ``run``, so ``bcl-stream --help``, ``plan``,
``simulate`` and ``inspect`` start in a fraction of a second (``tools/bench_cli_startup.py``;
``tests/unit/test_cli_imports.py`` guards the imports). Our own errors (:class:`BCLStreamError`,
``ValueError`` from argument checks, ``OSError`` on files) print as one line on stderr with exit
code 2; ``--debug`` (or ``BCL_STREAM_DEBUG=1`` in the environment) prints the traceback with
the whole chain of causes before that line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from types import ModuleType

import bcl_stream
from bcl_stream.commands import (
    annotate,
    calibrate,
    inspect,
    merge,
    plan,
    preprocess,
    read,
    simulate,
)
from bcl_stream.errors import DEBUG_ENV, BCLStreamError, report

COMMAND_MODULES: dict[str, ModuleType] = {
    "simulate": simulate,
    "plan": plan,
    "read": read,
    "calibrate": calibrate,
    "preprocess": preprocess,
    "annotate": annotate,
    "merge": merge,
    "inspect": inspect,
}
"""Each subcommand's module, in the order ``--help`` lists them."""
COMMANDS = list(COMMAND_MODULES)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when X says something: not for required
    options, flags (default False) or options whose absence means "off" (default None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or action.required
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every (sub)command shows its defaults in ``--help``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    try:
        return dist_version("bcl-stream")
    except PackageNotFoundError:
        return bcl_stream.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bcl-stream",
        description="Batch Cost Lookahead: balanced fixed-size packs for distributed training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"on error, print the traceback with every cause (or set {DEBUG_ENV}=1)",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for module in COMMAND_MODULES.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (BCLStreamError, ValueError, OSError) as exc:
        return report(f"bcl-stream {args.command}", exc, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
