"""The groups of :class:`~lightning_module.datamodule.BCLDataModule`'s arguments, and the flat
keys of earlier releases.

Each knob is declared once, as a dataclass field with its default and docstring: the planner's
in :class:`~bcl_stream.planner.config.PlanKnobs` (``plan``), the readers' in
:class:`~bcl_stream.formats.read_options.ReadOptions` (``read``) and
:class:`~bcl_stream.records.source.RecordSource` (``tokens``), the DataModule's own below
(``batch``, ``loader``, ``eval``, ``elastic``). The YAML nests them the same way
(``data.plan.window``, ``data.loader.num_workers``; docs/config.md lists every key, and a test
checks it against these docstrings). What the trainer decides (world size, data-parallel ranks
per node, gradient accumulation) is no argument at all.

Earlier releases took 33 flat arguments (``window``, ``num_workers``, ``val_data`` ...). They
are still read, through :func:`moved_keys`, with one warning line naming each new key, and win
over the group's value (a command line ``--data.window 4`` over a config's ``plan``); a key given
both ways is a FutureWarning, not an error, so older configs run unchanged until renamed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from lightning.pytorch.utilities import rank_zero_warn

from bcl_stream.epoch.eval_plan import EVAL_PACKINGS
from bcl_stream.errors import BCLStreamError
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.loading.collate import LABELS
from bcl_stream.planner.config import LAYOUT_FIELDS, PlanKnobs
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.records.source import RecordSource


@dataclass(frozen=True, kw_only=True)
class BatchOptions:
    """How the collate makes a batch of a pack."""

    collate: str = "padded"
    """The batch's tensors: ``padded`` (B rows padded to the longest record, an
    ``attention_mask``) or ``packed`` (one row, ``cu_seqlens``; docs/lightning.md, "The
    batch"). The plan's cost layout (``PlanConfig.layout``) follows it, so the plan balances
    the cost the batch will have: a padded batch costs B x its costliest record, a packed
    one the sum. ``padded`` by default because every model takes it; a model that ignores
    ``cu_seqlens`` would attend across the records of a packed row without a word. ``packed``
    balances better (docs/balance.md) where the model takes ``cu_seqlens``. (The planner's
    own default, for ``bcl-stream plan`` and the simulator, is ``packed``: a different
    setting, the cost a plan assumes.)"""

    max_seq_len: int | None = None
    """Truncate records to this many tokens in collate (reported per batch, and at set-up); the
    plan costs them as truncated. A model that states a lower limit (``HFCausalLM.max_seq_len``)
    lowers it. None: no truncation."""
    labels: str = "shifted"
    """``shifted`` (targets already shifted; a loss must not shift again) or ``unshifted``
    (Hugging Face convention: the model shifts). See docs/lightning.md."""

    def __post_init__(self) -> None:
        if self.collate not in LAYOUTS:
            raise ValueError(
                f"batch.collate: the batch layout must be one of {LAYOUTS}, got {self.collate!r}"
            )
        if self.labels not in LABELS:
            raise ValueError(f"batch.labels must be one of {LABELS}, got {self.labels!r}")
        limit = self.max_seq_len
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"batch.max_seq_len must be an integer >= 1 or None, got {limit!r}")


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
    fields."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"data.{name} must be a {cls.__name__} or a dict, got {value!r}")
    known = sorted(f.name for f in fields(cls))  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(known))
    if unknown:
        hint = {k: MOVED[k] for k in unknown if k in MOVED and not MOVED[k].startswith(name)}
        where = f"; elsewhere: {hint}" if hint else ""
        raise ConfigError(f"data.{name} has unknown keys {unknown}; its keys are {known}{where}")
    try:
        return cls(**value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data.{name}: {exc}") from exc


MOVED: dict[str, str] = {
    **{k: f"plan.{k}" for k in ("pack_size", "window", "scope", "max_tokens", "shuffle")},
    "layout": "batch.collate",
    "max_seq_len": "batch.max_seq_len",
    "labels": "batch.labels",
    "num_workers": "loader.num_workers",
    "persistent_workers": "loader.persistent_workers",
    **{k: f"read.{k}" for k in ("cache_limit", "download_timeout", "prefetch")},
    **{k: f"tokens.{k}" for k in ("tokens_field", "tokens_dtype", "text_field", "tokenizer")},
    **{k: f"eval.{k}" for k in ("val_data", "val_streams", "test_data", "test_streams")},
    "eval_packing": "eval.packing",
    **{k: f"elastic.{k}" for k in ("allow_resize", "canonical_ranks", "canonical_ranks_per_node")},
    "canonical_grad_accum": "elastic.canonical_grad_accum",
}
"""Flat argument of earlier releases -> its key now (group.field); ``canonical_grad_accum``
stands for ``plan.grad_accum`` under canonical ranks (a canonical rank's accumulation)."""
OLD_NAMES = {
    "canonical_grad_accum": "plan.grad_accum",
    "grad_accum": "plan.grad_accum",
    "plan_layout": "plan.layout",
}
"""How a warning spells the old keys that were inside ``plan``."""
PLAN_LAYOUT_KEYS = frozenset(LAYOUT_FIELDS)
"""PlanConfig fields the trainer decides: not knobs of ``plan``."""
TRAINER_DECIDES = {
    "ranks_per_node": "the trainer's data-parallel ranks per node",
    "grad_accum": "the trainer's accumulate_grad_batches",
    "plan_layout": "batch.collate",
}
"""Earlier arguments decided elsewhere (the trainer; the collate for ``plan.layout``): still
checked against what decides them, with a line to drop them."""


def moved_keys(
    *,
    pack_size: int | None = None,
    window: int | None = None,
    scope: str | None = None,
    max_tokens: int | None = None,
    shuffle: bool | None = None,
    layout: str | None = None,
    max_seq_len: int | None = None,
    labels: str | None = None,
    num_workers: int | None = None,
    persistent_workers: bool | None = None,
    cache_limit: int | str | None = None,
    download_timeout: float | None = None,
    prefetch: int | None = None,
    tokens_field: str | None = None,
    tokens_dtype: str | None = None,
    text_field: str | None = None,
    tokenizer: str | None = None,
    val_data: str | None = None,
    val_streams: list[Any] | None = None,
    test_data: str | None = None,
    test_streams: list[Any] | None = None,
    eval_packing: str | None = None,
    allow_resize: bool | None = None,
    canonical_ranks: int | None = None,
    canonical_ranks_per_node: int | None = None,
    ranks_per_node: int | None = None,
) -> dict[str, Any]:
    """The flat arguments of earlier releases that were given (not None), by old name.

    Deprecated, each one: use the key of :data:`MOVED` (``ranks_per_node``: none, the trainer
    decides it). Declared here, and not as ``**kwargs`` alone, so that LightningCLI
    (jsonargparse follows the DataModule's ``**moved`` into this signature) still reads them
    from an older YAML or command line.

    Args:
        pack_size: deprecated: data.plan.pack_size.
        window: deprecated: data.plan.window.
        scope: deprecated: data.plan.scope.
        max_tokens: deprecated: data.plan.max_tokens.
        shuffle: deprecated: data.plan.shuffle.
        layout: deprecated: data.batch.collate.
        max_seq_len: deprecated: data.batch.max_seq_len.
        labels: deprecated: data.batch.labels.
        num_workers: deprecated: data.loader.num_workers.
        persistent_workers: deprecated: data.loader.persistent_workers.
        cache_limit: deprecated: data.read.cache_limit.
        download_timeout: deprecated: data.read.download_timeout.
        prefetch: deprecated: data.read.prefetch.
        tokens_field: deprecated: data.tokens.tokens_field.
        tokens_dtype: deprecated: data.tokens.tokens_dtype.
        text_field: deprecated: data.tokens.text_field.
        tokenizer: deprecated: data.tokens.tokenizer.
        val_data: deprecated: data.eval.val_data.
        val_streams: deprecated: data.eval.val_streams.
        test_data: deprecated: data.eval.test_data.
        test_streams: deprecated: data.eval.test_streams.
        eval_packing: deprecated: data.eval.packing.
        allow_resize: deprecated: data.elastic.allow_resize.
        canonical_ranks: deprecated: data.elastic.canonical_ranks.
        canonical_ranks_per_node: deprecated: data.elastic.canonical_ranks_per_node.
        ranks_per_node: deprecated: the trainer decides it; drop the key.
    """
    given = dict(locals())
    return {k: v for k, v in given.items() if v is not None}


def plan_layout_keys(
    plan: dict[str, Any] | PlanKnobs | None,
    elastic: ElasticOptions | dict[str, Any] | None,
    old: dict[str, Any],
) -> tuple[dict[str, Any] | PlanKnobs | None, dict[str, Any]]:
    """``plan`` without what a ``plan`` dict of an earlier release could hold beside the
    knobs, and ``old`` with it: ``world_size`` is refused; ``ranks_per_node``, ``grad_accum``
    and ``layout`` join the old keys, checked against what decides them (the trainer; the
    collate), except that with canonical ranks ``grad_accum`` was G_c:
    ``elastic.canonical_grad_accum`` now."""
    if not isinstance(plan, dict) or not (PLAN_LAYOUT_KEYS | {"layout"}) & set(plan):
        return plan, old
    plan, old = dict(plan), dict(old)
    if "layout" in plan:
        old["plan_layout"] = plan.pop("layout")  # checked against batch.collate
    if "world_size" in plan:
        raise ValueError("plan.world_size: the trainer decides the data-parallel size; drop it")
    if "ranks_per_node" in plan:
        old["ranks_per_node"] = plan.pop("ranks_per_node")
    if "grad_accum" in plan:
        given = group(elastic, ElasticOptions, "elastic").canonical_ranks
        canonical = given is not None or old.get("canonical_ranks") is not None
        old["canonical_grad_accum" if canonical else "grad_accum"] = plan.pop("grad_accum")
    return plan, old


def warn_moved(old: dict[str, Any]) -> None:
    """One line naming each old key given and its new key (a FutureWarning: shown by
    default, unlike a DeprecationWarning, since the one who must act is the config's user)."""
    if not old:
        return
    renames = ", ".join(
        f"{OLD_NAMES.get(k, k)} -> {MOVED[k]}"
        if k in MOVED
        else f"{OLD_NAMES.get(k, k)} (drop it: {TRAINER_DECIDES[k]} decides)"
        for k in sorted(old)
    )
    rank_zero_warn(  # once per job, not once per rank
        f"BCLDataModule: flat keys of an earlier release: {renames}; rename them "
        "(YAML: data.plan.window ...; docs/config.md)",
        category=FutureWarning,
        stacklevel=6,  # the DataModule's caller: through rank_zero_warn's three frames
    )


def apply_moved(groups: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """``groups`` (name -> dataclass) with the old flat values put under their new keys (an old
    key wins over the group's value: it was given explicitly)."""
    out = dict(groups)
    by_group: dict[str, dict[str, Any]] = {}
    for key, value in old.items():
        if key in MOVED:
            name, _, field_name = MOVED[key].partition(".")
            by_group.setdefault(name, {})[field_name] = value
    for name, changes in by_group.items():
        out[name] = replace(out[name], **changes)
    return out


__all__ = [
    "MOVED",
    "BatchOptions",
    "ConfigError",
    "ElasticOptions",
    "EvalOptions",
    "LoaderOptions",
    "PlanKnobs",
    "ReadOptions",
    "RecordSource",
    "apply_moved",
    "group",
    "moved_keys",
    "plan_layout_keys",
    "warn_moved",
]
