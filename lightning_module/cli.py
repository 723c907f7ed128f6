"""``BCLCLI``: LightningCLI plus what the configs in ``configs/`` need on the command line.

- ``--root DIR``: the directory a config's relative paths resolve against
  (:mod:`lightning_module.config_paths` does the resolving, before parsing; the option is
  declared here so that LightningCLI accepts it, on the command line and as a config's
  ``root:`` key).
- ``--trainer.callbacks.N.KEY VALUE``: set one argument of the N-th callback of the list the
  configs give, e.g. ``--trainer.callbacks.0.init_args.directory runs/logs``. jsonargparse
  (4.53) has no index into a list of subclasses: it reads ``callbacks.0.init_args.directory``
  as an argument named ``0.init_args.directory`` of the last callback and refuses it ("Does
  not validate against any of the Union subtypes"); its own ``--trainer.callbacks.init_args.X``
  reaches only the last entry. Such options are taken off, the rest parsed, the edits made on
  the parsed list, and the command line parsed again with the edited list as one
  ``--trainer.callbacks`` value, so jsonargparse still checks every type.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from bcl_stream import BCLStreamError, StateError
from lightning_module.config_paths import ROOT_ENV

INDEXED = re.compile(r"^--trainer\.callbacks\.(?P<index>\d+)\.(?P<key>[A-Za-z_][\w.]*)$")
"""``--trainer.callbacks.N.KEY``: an argument of the N-th callback."""


def split_indexed(argv: list[str]) -> tuple[list[str], list[tuple[int, str, str]]]:
    """``argv`` without its ``--trainer.callbacks.N.KEY VALUE`` options, and those as
    (N, KEY, VALUE) in order."""
    plain: list[str] = []
    edits: list[tuple[int, str, str]] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        match = INDEXED.match(name)
        if match is None:
            plain.append(argv[i])
        elif eq:
            edits.append((int(match["index"]), match["key"], value))
        elif i + 1 < len(argv):
            edits.append((int(match["index"]), match["key"], argv[i + 1]))
            i += 1
        else:
            plain.append(argv[i])  # no value: jsonargparse's own message
        i += 1
    return plain, edits


def _as_dict(value: Any) -> Any:
    return value.as_dict() if isinstance(value, Namespace) else value


def edited_callbacks(callbacks: Any, edits: list[tuple[int, str, str]]) -> list[Any]:
    """The parsed callbacks list (as dicts) with ``edits`` applied; a ValueError names an
    index past the list. A value is read as YAML, as jsonargparse reads command-line values
    (``5`` an int, ``null`` None, text a string)."""
    items = [_as_dict(c) for c in (callbacks if isinstance(callbacks, list) else [callbacks])]
    items = [c for c in items if c is not None]
    for index, key, text in edits:
        if index >= len(items):
            raise ValueError(
                f"--trainer.callbacks.{index}.{key}: the config gives {len(items)} callbacks "
                f"(indexes 0 to {len(items) - 1})"
            )
        node = items[index]
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node, dict):
                raise ValueError(f"--trainer.callbacks.{index}.{key}: {part!r} is not a section")
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--trainer.callbacks.{index}.{key}: not a section of arguments")
        node[last] = yaml.safe_load(text)
    return items


class BCLCLI(LightningCLI):
    """LightningCLI with ``--root`` and indexed callback options (module docstring)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--root",
            type=str | None,
            default=None,
            help="directory that relative paths in the config files resolve against (default: "
            f"${ROOT_ENV}, else the config's own root: key, relative to the file, else the "
            "config file's directory); paths typed on the command line stay relative to the "
            "current directory",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's parse, plus the ``--trainer.callbacks.N.KEY`` edits."""
        if isinstance(args, dict | Namespace):
            super().parse_arguments(parser, args)
            return
        argv = list(sys.argv[1:] if args is None else args)
        plain, edits = split_indexed(argv)
        if not edits:
            self.config = parser.parse_args(argv)
            return
        # --print_config prints and exits inside the parse: only the second one may print.
        config = parser.parse_args([a for a in plain if not a.startswith("--print_config")])
        section = config[config["subcommand"]] if config.get("subcommand") else config
        try:
            items = edited_callbacks(section.get("trainer.callbacks"), edits)
        except ValueError as exc:  # one line from python -m lightning_module, exit 2
            raise BCLStreamError(str(exc)) from exc
        self.config = parser.parse_args(
            [*plain, "--trainer.callbacks=" + json.dumps(items, default=str)]
        )

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's read of ``--ckpt_path`` (``torch.load(weights_only=True)``, which
        refuses a file holding anything but tensors and plain containers, such as a pickle that
        would run code): a refusal or an unreadable file is one line naming the file and what
        to do (exit 2), not torch's 24-line traceback; the cause is chained for ``--debug``."""
        try:
            super()._parse_ckpt_path()
        except Exception as exc:
            subcommand = self.config.get("subcommand")
            path = self.config[subcommand].get("ckpt_path") if subcommand else None
            raise StateError(
                f"--ckpt_path {path}: refused: torch cannot load it as a checkpoint "
                f"({type(exc).__name__}: {_gist(exc)}). Resume from a checkpoint this training "
                "wrote (lightning_module.checkpoints.last_complete_checkpoint finds the last "
                "complete one); a file from elsewhere may carry code to run, so load and "
                "re-save it yourself only if you trust where it came from"
            ) from exc


def _gist(exc: BaseException) -> str:
    """The telling line of a (multi-line) exception message: torch's safe loader explains
    itself over several paragraphs, the line naming what it refused is the one that matters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("Trying to load", "Unsupported")):
            return line
    return lines[0] if lines else "no message"
