"""The groups of :class:`~lightning_module.datamodule.BCLDataModule`'s arguments.

Each knob is declared once, as a dataclass field with its default and docstring: the planner's
in :class:`~bcl_stream.planner.config.PlanKnobs` (``plan``), the collate's in
:class:`~bcl_stream.training.knobs.BatchOptions` (``batch``), the readers' in
:class:`~bcl_stream.formats.read_options.ReadOptions` (``read``) and
:class:`~bcl_stream.records.source.RecordSource` (``tokens``), the DataModule's own below
(``loader``, ``eval``, ``elastic``). The YAML nests them the same way
(``data.plan.window``, ``data.loader.num_workers``; docs/config.md lists every key, and a test
checks it against these docstrings). What the trainer decides (world size, data-parallel ranks
per node, gradient accumulation) is no argument at all.

Only the groups are read: a flat key (``window=4``, YAML ``data.window``) is refused in one
line naming the grouped key to use (:func:`refuse_flat`). The package has had no release, so
no translation of older keys is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Generic, NoReturn, TypeVar, overload

from bcl_stream import BCLStreamError, PlanKnobs, ReadOptions, RecordSource
from bcl_stream.training import EVAL_PACKINGS, BatchOptions


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """The DataLoader's processes (any count yields the same packs in the same order)."""

    num_workers: int = 0
    """DataLoader worker processes (0: read in the training process)."""
    persistent_workers: bool = False
    """Keep the workers between epochs (needs ``num_workers`` >= 1)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int):
            raise ValueError(f"loader.num_workers must be an integer, got {self.num_workers!r}")
        if self.num_workers < 0:
            raise ValueError(f"loader.num_workers must be >= 0, got {self.num_workers}")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("loader.persistent_workers=True needs loader.num_workers >= 1")


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """Validation and test data: every record evaluated once across ranks, in the same number
    of packs of at most ``plan.pack_size`` records on every rank (docs/lightning.md,
    "Validation and test")."""

    val_data: str | None = None
    """One validation dataset (a directory or ``s3://`` URL)."""
    val_streams: list[Any] | None = None
    """Several validation datasets, one loader each, each read whole (``PATH[:options]`` or
    dicts, as ``streams``; weights do not apply)."""
    test_data: str | None = None
    """One test dataset."""
    test_streams: list[Any] | None = None
    """Several test datasets, one loader each."""
    packing: str | None = None
    """``sequential`` (write order) or ``bcl`` (packs of similar cost, steps balanced across
    ranks); None: the training ``packing``."""

    def __post_init__(self) -> None:
        if self.packing is not None and self.packing not in EVAL_PACKINGS:
            raise ValueError(f"eval.packing must be one of {EVAL_PACKINGS}, got {self.packing!r}")


@dataclass(frozen=True, kw_only=True)
class ElasticOptions:
    """Resuming on another data-parallel size (docs/elastic.md)."""

    allow_resize: bool = True
    """Resume a state saved under another world size (re-planning the rest of the epoch) or
    refuse it."""
    canonical_ranks: int | None = None
    """Plan for V canonical data-parallel ranks: the optimizer steps are the same at every
    data-parallel size R dividing V, and a checkpoint resumes at any such R. None: plan for
    the trainer's ranks."""
    canonical_ranks_per_node: int | None = None
    """Canonical ranks per node (None: on a resume the checkpoint's, on a fresh run the
    trainer's ranks per node); a value that contradicts the checkpoint's is refused."""
    canonical_grad_accum: int | None = None
    """A canonical rank's gradient accumulation G_c (None: 1); the trainer's
    ``accumulate_grad_batches`` must then be G_c*V/R (a mismatch is refused, naming the
    value). Only with ``canonical_ranks``: otherwise the trainer's accumulation is the plan's."""

    def __post_init__(self) -> None:
        if self.canonical_ranks is None and self.canonical_grad_accum is not None:
            raise ValueError(
                "elastic.canonical_grad_accum applies with elastic.canonical_ranks only; without "
                "it the trainer's accumulate_grad_batches is the plan's"
            )


G = TypeVar("G")


class ConfigError(BCLStreamError, ValueError):
    """A DataModule group with a key it does not have or a value it refuses, named as the YAML
    spells it (``data.plan: window must be an integer ...``). A ValueError, and one of ours,
    so ``python -m lightning_module`` prints it as one line (exit 2), not a traceback."""


def group(value: G | dict[str, Any] | None, cls: type[G], name: str) -> G:
    """An argument group as its dataclass: an instance as given, a dict (Python, or YAML read
    without its type) checked field by field, None the defaults. Unknown keys name the group's
    fields; a key the trainer or the collate decides says so."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"data.{name} must be a {cls.__name__} or a dict, got {value!r}")
    decided = sorted(set(value) & set(DECIDED_ELSEWHERE)) if cls is PlanKnobs else []
    if decided:
        raise ConfigError(
            f"data.{name}.{decided[0]}: {DECIDED_ELSEWHERE[decided[0]]} decides it; drop the key"
        )
    known = sorted(f.name for f in fields(cls))  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(known))
    if unknown:
        elsewhere = {k: homes[0] for k in unknown if (homes := grouped_keys(k))}
        where = f"; elsewhere: {elsewhere}" if elsewhere else ""
        raise ConfigError(f"data.{name} has unknown keys {unknown}; its keys are {known}{where}")
    try:
        return cls(**value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data.{name}: {exc}") from exc


DECIDED_ELSEWHERE = {
    "layout": "batch.collate (the plan balances the cost of the batches the collate makes)",
    "world_size": "the trainer's data-parallel size",
    "ranks_per_node": "the trainer's data-parallel ranks per node",
    "grad_accum": "the trainer's accumulate_grad_batches (elastic.canonical_grad_accum under "
    "canonical ranks)",
}
"""Keys a ``plan`` dict may not hold (:data:`~bcl_stream.planner.config.LAYOUT_FIELDS` and the
cost layout), and what decides each instead."""

GROUP_CLASSES: tuple[tuple[str, type], ...] = (
    ("plan", PlanKnobs),
    ("batch", BatchOptions),
    ("loader", LoaderOptions),
    ("read", ReadOptions),
    ("tokens", RecordSource),
    ("eval", EvalOptions),
    ("elastic", ElasticOptions),
)
"""The DataModule's groups (YAML ``data.<group>``) and the dataclass declaring each one's keys."""


def grouped_keys(name: str) -> list[str]:
    """The grouped keys named ``name`` (``window`` -> ``["data.plan.window"]``), found from the
    groups' fields: no table of old names to keep."""
    return [
        f"data.{group_name}.{name}"
        for group_name, cls in GROUP_CLASSES
        if name in {f.name for f in fields(cls)} and name not in DECIDED_ELSEWHERE
    ]


def refuse_flat(given: dict[str, Any]) -> None:
    """Refuse keyword arguments that are no DataModule argument, in one line naming, for the
    first, the grouped key of that name or what decides it."""
    if not given:
        return
    name = sorted(given)[0]
    homes = grouped_keys(name)
    if homes:
        fix = f"use {' or '.join(homes)}"
    elif name in DECIDED_ELSEWHERE:
        fix = f"{DECIDED_ELSEWHERE[name]} decides it: drop the key"
    else:
        fix = "docs/config.md lists every key"
    raise ConfigError(f"data.{name} is not a key of BCLDataModule; {fix}")


K = TypeVar("K")


class KnobView(Generic[K]):
    """A read-only attribute of the DataModule: the same-named field of its ``knobs``
    (``TrainingKnobs``, which declares and documents each). One declaration per knob instead of
    one property each; like a property without a setter, assigning it raises, so ``knobs``
    stays the one place a choice is held."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, module: None, owner: type | None = None) -> KnobView[K]: ...
    @overload
    def __get__(self, module: object, owner: type | None = None) -> K: ...
    def __get__(self, module: Any, owner: type | None = None) -> K | KnobView[K]:
        if module is None:
            return self
        value: K = getattr(module.knobs, self.name)
        return value

    def __set__(self, module: object, value: NoReturn) -> NoReturn:
        raise AttributeError(f"{self.name} is read-only: it is knobs.{self.name}, chosen at init")


__all__ = [
    "GROUP_CLASSES",
    "BatchOptions",
    "ConfigError",
    "ElasticOptions",
    "EvalOptions",
    "KnobView",
    "LoaderOptions",
    "PlanKnobs",
    "ReadOptions",
    "RecordSource",
    "group",
    "grouped_keys",
    "refuse_flat",
]
