"""Command-line options generated from :class:`~bcl_stream.planner.PlanConfig`'s fields.

``plan``, ``read`` and ``simulate`` all take every planning knob. Writing those options by hand
in each command let them drift apart (each command knew a different subset, with its own
default), so they are generated here from the dataclass: the option is the field name with
dashes, the help text the first sentence of the field's docstring, the type and choices follow
the annotation. Options that are not given stay absent from the namespace
(``argparse.SUPPRESS``), so :func:`plan_fields` passes only what the user set and the defaults
stay PlanConfig's own.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import sys
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from bcl_stream.planner.config import PACK_ORDERS, SCOPES, PlanConfig
from bcl_stream.planner.contracts import CONTRACTS
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.planner.partition import ALGORITHMS

CHOICES: dict[str, tuple[str, ...]] = {
    "scope": SCOPES,
    "algorithm": tuple(sorted(ALGORITHMS)),
    "pack_order": PACK_ORDERS,
    "layout": LAYOUTS,
    "contract": CONTRACTS,
}
NONE = "none"
"""Spelling of None on the command line for ``int | None`` fields (``--max-tokens none``)."""
NONE_SPELLING = {"carry": "auto"}
"""Fields whose None is not "off": ``carry`` None means W*B/4 records (on), while its default 0
is off, so ``--carry none`` read as "no carry" turned it on. It is spelled ``auto`` instead,
and ``none`` is refused with what to write."""
PLAN_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(PlanConfig) if f.default is not MISSING
}
"""PlanConfig's defaults: the one set every command (and the DataModule) starts from."""


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string literal after each field), by field
    name, its bases' included (a subclass's own win), whitespace folded."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        tree = ast.parse(inspect.getsource(sys.modules[klass.__module__]))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                for stmt, after in itertools.pairwise(node.body):
                    if (
                        isinstance(stmt, ast.AnnAssign)
                        and isinstance(stmt.target, ast.Name)
                        and isinstance(after, ast.Expr)
                        and isinstance(after.value, ast.Constant)
                        and isinstance(after.value.value, str)
                    ):
                        docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def field_docs() -> dict[str, str]:
    """PlanConfig's attribute docstrings (its knobs' are PlanKnobs'), by name."""
    return attribute_docs(PlanConfig)


def _first_sentence(text: str) -> str:
    cut = text.find(". ")
    return (text if cut < 0 else text[: cut + 1]).replace("``", "").replace("%", "%%")


def _int_or_none(text: str) -> int | None:
    if text == NONE:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer or {NONE!r}, got {text!r}") from exc


def _carry(text: str) -> int | None:
    """``--carry``: records per rank, 0 (off, the default) or ``auto`` (W*B/4)."""
    if text == NONE_SPELLING["carry"]:
        return None
    if text == NONE:
        raise argparse.ArgumentTypeError(
            "'none' is ambiguous for --carry: write 0 for no carry (the default) or "
            f"{NONE_SPELLING['carry']!r} for W*B/4 records"
        )
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected an integer or {NONE_SPELLING['carry']!r}, got {text!r}"
        ) from exc


def option(name: str) -> str:
    """The command-line spelling of a PlanConfig field."""
    return "--" + name.replace("_", "-")


def add_plan_config_options(
    p: argparse.ArgumentParser,
    *,
    skip: frozenset[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """One option per PlanConfig field (except ``skip``). Fields without a default are
    required unless ``defaults`` gives one (a command's own scenario default, e.g.
    ``simulate``'s); ``aliases`` adds spellings (``--ranks`` for ``--world-size``)."""
    docs, defaults, aliases = field_docs(), defaults or {}, aliases or {}
    group = p.add_argument_group("planner (bcl_stream.planner.PlanConfig)")
    for f in fields(PlanConfig):
        if f.name in skip:
            continue
        names = (option(f.name), *aliases.get(f.name, ()))
        kwargs: dict[str, Any] = {"dest": f.name, "help": _first_sentence(docs.get(f.name, ""))}
        if f.name in defaults:
            kwargs["default"] = defaults[f.name]  # the help formatter shows it
        elif f.default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = argparse.SUPPRESS
            shown = NONE_SPELLING.get(f.name, NONE) if f.default is None else f.default
            kwargs["help"] += f" (default: {shown})"
        if f.type == "bool":
            group.add_argument(*names, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if f.type == "int":
            kwargs["type"] = int
        elif f.type == "int | None":
            spelling = NONE_SPELLING.get(f.name, NONE)
            kwargs["help"] = kwargs["help"].replace("None: ", f"{spelling}: ")
            kwargs["type"] = _carry if f.name == "carry" else _int_or_none
            kwargs["metavar"] = f"INT|{spelling}"
        elif f.type == "float":
            kwargs["type"] = float
        elif f.type == "str":
            kwargs["choices"] = CHOICES.get(f.name)
        else:  # a new field type needs a parser here
            raise TypeError(f"PlanConfig.{f.name}: no command-line type for {f.type!r}")
        group.add_argument(*names, **kwargs)


def plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The PlanConfig fields set on the command line (the rest keep PlanConfig's defaults)."""
    given = vars(args)
    return {f.name: given[f.name] for f in fields(PlanConfig) if f.name in given}


def add_canonical_options(p: argparse.ArgumentParser) -> None:
    """``--canonical-ranks`` / ``--canonical-ranks-per-node`` (``plan``, ``read``, ``simulate``):
    plan for V canonical ranks, run on ``--world-size`` physical ranks (docs/elastic.md)."""
    p.add_argument(
        "--canonical-ranks",
        type=int,
        default=None,
        metavar="V",
        help="plan for V canonical ranks, run on --world-size ranks (dividing V): the same "
        "optimizer steps at every size (docs/elastic.md)",
    )
    p.add_argument(
        "--canonical-ranks-per-node",
        type=int,
        default=None,
        help="canonical ranks per node (default: --ranks-per-node)",
    )
