"""``BCLDataModule``: balanced packs for Lightning (Trainer and Fabric), resumable exactly.

What it adds on top of the readers (``MDSPackDataset`` / ``WDSPackDataset`` + ``PackLoader``):

- **Rank setup for Mosaic Streaming.** Lightning's ``ddp`` launcher sets ``LOCAL_RANK``,
  ``NODE_RANK`` and ``WORLD_SIZE`` but not ``RANK`` or ``LOCAL_WORLD_SIZE``; streaming reads
  those three to name its shared memory, and without them two ranks collide
  (``FileExistsError: '/0000NN_locals'``). :meth:`setup` sets them from the trainer before the
  dataset exists.
- **One cursor, saved twice.** The loader (``PackLoader``) owns the cursor. Lightning saves
  the loader's ``state_dict()`` and restores it before ``iter()``, except under bug #20550
  (``configure_optimizers`` reading ``trainer.estimated_stepping_batches`` with ``max_epochs``
  set): then the loader state is silently dropped and the run restarts the epoch. The
  DataModule's ``state_dict`` is restored in every case (before ``configure_optimizers``), so
  it saves the loader's cursor too and its ``load_state_dict`` hands it to the loader (held
  only until the loader exists, when loaded before setup). Loading the same cursor twice is
  harmless.
- **Collate.** Packs become padded (``input_ids``, ``attention_mask``, ``labels``) or packed
  varlen (``input_ids``, ``cu_seqlens``, ``position_ids``, ``labels``) batches
  (``bcl_stream.loading.collate``); the batch also carries ``sample_ids``, ``tokens`` and
  ``est_cost`` (the pack's estimated cost) for ``PackLogger``.
- **A ``sequential`` baseline through the same reader path** (``packing="sequential"``, a
  planning strategy of the core: ``ReaderConfig.packing``, ``bcl-stream plan --packing``): the
  next B records of the rank's share of the same epoch order, what a plain loader does. Only
  the plan differs, so a measured difference between the two is the planner's doing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import numpy.typing as npt
import torch
from lightning.pytorch.utilities import rank_zero_info

from bcl_stream.cost import resolve
from bcl_stream.errors import StateError
from bcl_stream.formats.reader_base import Pack, PlanDataset
from bcl_stream.loading.collate import LABELS, collate_packed, collate_padded
from bcl_stream.loading.loader import PackLoader
from bcl_stream.plan.checks import require_packs
from bcl_stream.plan.cursor import MIXTURE_CHANGES
from bcl_stream.plan.epoch import PACKINGS, PLAN_FIELDS, ReaderConfig
from bcl_stream.plan.streams import MixtureIndex
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.padded import LAYOUTS

KEY_READER = "reader"
KEY_PACKING = "packing"


@dataclass(frozen=True, slots=True)
class PackCollate:
    """Pack -> batch dict (module level and frozen: picklable for worker processes)."""

    layout: str
    costs: npt.NDArray[np.floating[Any]] | tuple[npt.NDArray[np.floating[Any]], ...]
    """Per-record estimated costs by sample id (the planner's costs): an array, or for a
    mixture one array per stream."""
    max_seq_len: int | None = None
    labels: str = "shifted"
    step_records: int | None = None
    """Under ``contract="step"``: B, the mean records per micro-batch. Each batch then carries
    ``loss_scale`` = its records / B: a micro-batch's mean loss times it, accumulated over G
    micro-batches with Lightning's 1/G, weighs every record of the step as the ``pack``
    contract does (docs/lightning.md, "Variable micro-batches")."""

    def __call__(self, pack: Pack) -> dict[str, torch.Tensor]:
        fn = collate_packed if self.layout == "packed" else collate_padded
        batch = fn(pack, self.max_seq_len, self.labels)
        if self.step_records is not None:
            batch["loss_scale"] = torch.tensor(len(pack) / self.step_records)
        ids = batch["sample_ids"].numpy()
        streams = batch["streams"].numpy() if "streams" in batch else np.zeros_like(ids)
        per_stream = self.costs if isinstance(self.costs, tuple) else (self.costs,)
        cost = sum(float(per_stream[s][i]) for s, i in zip(streams, ids, strict=True))
        batch["est_cost"] = torch.tensor(cost, dtype=torch.float64)
        return batch


class TrainerPackLoader(PackLoader):
    """``PackLoader`` whose ``len()`` counts the epoch the way Lightning's fit loop does.

    After an elastic resume (checkpoint from another world size) the reader re-plans the rest
    of the epoch: its cursor restarts at pack 0 of the new plan, while Lightning restores its
    own batch counter (k batches done) and ends the epoch when that counter reaches ``len()``.
    With the plain plan length Lightning would stop k packs early and the next epoch would
    start inside this one. Here ``len()`` = packs consumed under earlier world sizes + packs
    of the new plan, so both counters agree; iteration and the saved cursor are unchanged.
    """

    def __len__(self) -> int:
        return sum(s.packs_consumed for s in self._segments) + self.plan_len()


def make_dataset(
    format: str,
    data: str | None,
    config: ReaderConfig,
    rank: int,
    *,
    cache_dir: str | None = None,
    streams: list[Any] | None = None,
    epoch_size: int | None = None,
) -> PlanDataset:
    """The reader for ``format`` (or the mixture of ``streams``, each read in its own format);
    the planning strategy (``bcl`` or ``sequential``) is ``config.packing``.

    Readers are imported here: ``streaming`` takes seconds to import.
    """
    dataset: PlanDataset
    if streams is not None:
        from bcl_stream.formats.mixture_reader import MixturePackDataset

        dataset = MixturePackDataset(
            streams, config, rank, cache_dir=cache_dir, epoch_size=epoch_size
        )
    elif data is None:
        raise ValueError("BCLDataModule needs data (one dataset) or streams (a mixture)")
    elif format == "mds":
        from bcl_stream.formats.mds_reader import MDSPackDataset

        dataset = MDSPackDataset(data, config, rank, cache_dir=cache_dir)
    else:
        from bcl_stream.formats.wds_reader import WDSPackDataset

        dataset = WDSPackDataset(data, config, rank, cache_dir=cache_dir)
    return dataset


def set_streaming_env(local_world_size: int) -> None:
    """Export what Mosaic Streaming reads to find this process (see the module docstring).

    Only under an initialised process group, and from it: streaming must see the real process
    layout. A single process that plans for a rank of a larger world (tests, inspection) keeps
    streaming's defaults (rank 0 of 1) and the environment untouched.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    os.environ["RANK"] = str(torch.distributed.get_rank())
    os.environ["WORLD_SIZE"] = str(torch.distributed.get_world_size())
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)


LEN_WARNING = r"Your `IterableDataset` has `__len__` defined"


def _explain_len_warning() -> None:
    """Silence Lightning's "IterableDataset has __len__" warning, which does not apply here.

    Lightning warns because a ``__len__`` can be wrong when DataLoader workers each yield the
    whole dataset. Ours is exact by construction: worker w of K yields packs w, w+K, ... of
    this rank's plan, and ``len()`` is the plan's pack count (tests check it for 0, 1 and 2
    workers). The filter matches that one message only.
    """
    import warnings

    warnings.filterwarnings("ignore", message=LEN_WARNING)


OWN_ARGUMENTS = (
    "world_size",
    "ranks_per_node",
    "pack_size",
    "window",
    "scope",
    "max_tokens",
    "shuffle",
)
"""PlanConfig fields with an argument of their own (or set from the trainer): not in ``plan``."""


def check_plan_knobs(
    plan: dict[str, Any] | None, *, pack_size: int, window: int, scope: str
) -> dict[str, Any]:
    """``BCLDataModule(plan=...)`` checked now (not in a worker): known PlanConfig fields, none
    that has its own argument, values PlanConfig accepts. Returns a copy."""
    knobs = dict(plan or {})
    unknown = sorted(set(knobs) - PLAN_FIELDS)
    if unknown:
        raise ValueError(
            f"plan has unknown keys {unknown}; planner knobs are {sorted(PLAN_FIELDS)}"
        )
    own = sorted(set(knobs) & set(OWN_ARGUMENTS))
    if own:
        raise ValueError(
            f"plan sets {own}: give them as BCLDataModule arguments (world_size comes from the "
            "trainer), not inside plan"
        )
    PlanConfig(world_size=1, pack_size=pack_size, window=window, scope=scope, **knobs)
    return knobs


class BCLDataModule(pl.LightningDataModule):
    """Balanced, resumable training packs from a costed MDS or WebDataset dataset.

    Args:
        data: dataset root, a local directory or ``s3://bucket/prefix`` (what preprocess wrote).
        streams: a mixture instead of ``data``: a list of streams, each ``"PATH[:key=value]"``
            or a dict ``{path, proportion | repeat | choose, cost_model}`` (docs/mixtures.md).
            Each stream is read in its own format; ``format`` is ignored.
        epoch_size: records per epoch of a mixture given by proportions (default: every
            stream's records once).
        on_mixture_change: resuming a checkpoint whose mixture differs (streams, weights,
            data): ``refuse`` (default, the error says what changed) or ``restart_epoch``
            (start the checkpoint's epoch over with the new mixture).
        format: ``mds`` or ``wds`` (WebDataset supports scope ``rank`` only).
        pack_size: records per pack B (the trainer's batch size: the record-count contract).
        window: packs per rank planned together W (buffer W*B records per rank).
        scope: ``rank`` | ``node`` | ``world``: which ranks are balanced jointly.
        packing: ``bcl`` (balanced) or ``sequential`` (the plain-loader baseline).
        cost_model: preset name or cost-model JSON to recompute costs from the stored token
            counts; None uses the costs written at preprocessing.
        max_tokens: memory cap M per pack (records longer than M are reported, not yielded).
        layout: ``padded`` or ``packed`` (varlen with ``cu_seqlens``).
        max_seq_len: truncate records to this many tokens in collate (reported per batch).
        labels: ``shifted`` (targets already shifted; a loss must not shift again) or
            ``unshifted`` (Hugging Face convention: the model shifts). See docs/lightning.md.
        num_workers, persistent_workers: DataLoader workers (any count gives the same packs).
        seed: shuffle seed; the epoch order is a pure function of (seed, epoch).
        shuffle: False keeps write order.
        cache_dir: local cache for a remote dataset (required for ``s3://``).
        ranks_per_node: ranks per node; None takes the trainer's devices per node.
        allow_resize: resume a state saved under another world size (elastic) or refuse it.
        plan: any other planner knob, by ``PlanConfig`` field name (``algorithm``, ``refine``,
            ``pack_order``, ``step_fill``, ``carry``, ``carry_span``, ``grad_accum``,
            ``stratify``, ``split_shards``, ``shard_group``); unset ones keep PlanConfig's
            defaults. YAML: ``data.init_args.plan: {carry_span: 32}``. The knobs above with
            their own argument, and ``world_size`` (the trainer's), are refused here.
    """

    def __init__(
        self,
        data: str | None = None,
        *,
        streams: list[Any] | None = None,
        epoch_size: int | None = None,
        on_mixture_change: str = "refuse",
        format: str = "mds",
        pack_size: int = 8,
        window: int = 16,
        scope: str = "rank",
        packing: str = "bcl",
        cost_model: str | None = None,
        max_tokens: int | None = None,
        layout: str = "padded",
        max_seq_len: int | None = None,
        labels: str = "shifted",
        num_workers: int = 0,
        persistent_workers: bool = False,
        seed: int = 0,
        shuffle: bool = True,
        cache_dir: str | None = None,
        ranks_per_node: int | None = None,
        allow_resize: bool = True,
        plan: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.plan = check_plan_knobs(plan, pack_size=pack_size, window=window, scope=scope)
        if (data is None) == (streams is None):
            raise ValueError("give BCLDataModule either data (one dataset) or streams (a mixture)")
        if streams is not None:
            from bcl_stream.plan.streams import StreamSpec

            if not isinstance(streams, list | tuple) or not streams:
                raise ValueError(f"streams must be a non-empty list, got {streams!r}")
            streams = [StreamSpec.of(x).to_dict() for x in streams]  # refuse bad specs now
        elif epoch_size is not None:
            raise ValueError("epoch_size applies to a mixture (streams) only")
        if on_mixture_change not in MIXTURE_CHANGES:
            raise ValueError(
                f"on_mixture_change must be one of {MIXTURE_CHANGES}, got {on_mixture_change!r}"
            )
        self.streams, self.epoch_size = streams, epoch_size
        self.on_mixture_change = on_mixture_change
        if format not in ("mds", "wds"):
            raise ValueError(f"format must be 'mds' or 'wds', got {format!r}")
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers=True needs num_workers >= 1")
        if cost_model is not None:
            resolve(cost_model)  # fail now, with the preset list, not inside a worker
        self.data, self.format, self.packing, self.layout = data, format, packing, layout
        self.pack_size, self.window, self.scope = pack_size, window, scope
        self.cost_model, self.max_tokens, self.max_seq_len = cost_model, max_tokens, max_seq_len
        self.labels = labels
        self.num_workers, self.persistent_workers = num_workers, persistent_workers
        self.seed, self.shuffle, self.cache_dir = seed, shuffle, cache_dir
        self.ranks_per_node, self.allow_resize = ranks_per_node, allow_resize
        self.dataset: PlanDataset | None = None
        self._loader: TrainerPackLoader | None = None
        self._pending: dict[str, Any] | None = None
        """A cursor loaded before setup; the loader takes it over when built."""
        self._announced = False

    # -- building -------------------------------------------------------------------------
    def _ranks_from_trainer(self) -> tuple[int, int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.global_rank, trainer.world_size, max(1, trainer.num_devices)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            return torch.distributed.get_rank(), world, local
        return 0, 1, 1

    def setup(self, stage: str | None = None) -> None:
        """Build the dataset for this rank (Trainer: called by Lightning on every rank)."""
        if self.dataset is None:
            self.setup_for(*self._ranks_from_trainer())

    def setup_for(self, rank: int, world_size: int, ranks_per_node: int) -> None:
        """Build the dataset for an explicit layout (Fabric scripts and tests call this)."""
        trainer = getattr(self, "trainer", None)
        accumulate = getattr(trainer, "accumulate_grad_batches", None)
        steps = self.plan.get("grad_accum", 1)
        if self.plan.get("contract") == "step" and accumulate is not None and accumulate != steps:
            raise ValueError(
                f"contract='step' re-cuts steps of plan.grad_accum={steps} micro-batches but the "
                f"trainer accumulates {accumulate}; set plan.grad_accum={accumulate}"
            )
        local = self.ranks_per_node or ranks_per_node
        set_streaming_env(local)
        self.dataset = make_dataset(
            self.format,
            self.data,
            self.reader_config(world_size, local),
            rank,
            cache_dir=self.cache_dir,
            streams=self.streams,
            epoch_size=self.epoch_size,
        )

    def reader_config(self, world_size: int, ranks_per_node: int) -> ReaderConfig:
        """The readers' configuration under a layout: the arguments plus ``plan``'s knobs."""
        return ReaderConfig.build(
            world_size=world_size,
            pack_size=self.pack_size,
            window=self.window,
            ranks_per_node=ranks_per_node,
            scope=self.scope,
            seed=self.seed,
            shuffle=self.shuffle,
            max_tokens=self.max_tokens,
            cost_model=self.cost_model,
            packing=self.packing,
            tokens=None,  # the cost index's own source (the readers resolve it)
            # contract="step" re-cuts steps for the layout the model runs (plan/steps.py)
            **({"layout": self.layout} if self.plan.get("contract") == "step" else {}),
            **self.plan,
        )

    def _require_dataset(self) -> PlanDataset:
        if self.dataset is None:
            raise RuntimeError("BCLDataModule: call setup() (or setup_for()) before using it")
        return self.dataset

    def collate(self) -> PackCollate:
        """The collate function the loader uses (also handy for inspecting batches)."""
        ds = self._require_dataset()
        model = None if self.cost_model is None else resolve(self.cost_model)
        index = ds.index
        if isinstance(index, MixtureIndex):
            models = index.stream_models(model)
            costs = tuple(ix.costs(m) for ix, m in zip(index.indexes, models, strict=True))
        else:
            costs = (index.costs(model),)
        step = self.pack_size if self.plan.get("contract") == "step" else None
        return PackCollate(self.layout, costs, self.max_seq_len, self.labels, step)

    def train_dataloader(self) -> PackLoader:
        """One loader per DataModule: it owns the cursor, so a second call returns it again.

        Raises :class:`PlanError` when the plan gives no rank a single pack (Lightning would
        otherwise stop on "No training batches" and exit 0). The info line describes the plan
        the loader will follow, after any checkpoint's cursor (an elastic resume included).
        """
        ds = self._require_dataset()
        loader = self._make_loader()
        if not self._announced:
            self._announced = True
            plan = loader.current_plan()
            require_packs(
                self.data or ds.location,
                plan,
                ds.config,
                len(ds.index),
                fix="Lower pack_size or the number of ranks, or use more data.",
            )
            counts = plan.remainder_counts()
            rank_zero_info(
                f"BCLDataModule: {self.packing} packing, {plan.n_packs} packs of "
                f"{self.pack_size} records per rank in epoch {plan.epoch} on "
                f"{ds.config.plan.world_size} ranks; records of that epoch not yielded, by reason: "
                f"{counts or 'none'}"
            )
        return loader

    def _make_loader(self) -> TrainerPackLoader:
        """The one loader (built once, after setup): the owner of the cursor. A cursor loaded
        before setup is applied to it here."""
        if self._loader is None:
            _explain_len_warning()
            self._loader = TrainerPackLoader(
                self._require_dataset(),
                num_workers=self.num_workers,
                persistent_workers=self.persistent_workers,
                collate_fn=self.collate(),
                allow_resize=self.allow_resize,
                on_mixture_change=self.on_mixture_change,
            )
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._loader.load_state_dict(pending)
        return self._loader

    def remainder_counts(self) -> dict[str, int]:
        """Records no rank yields, by reason (the same on every rank), of the epoch the loader
        last started (after training: the epoch that ran, not the next one)."""
        return self._require_dataset().remainder_counts()

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"packing", "reader"}``: the loader's cursor (or the one waiting to be applied)."""
        reader = self._loader.state_dict() if self._loader is not None else self._pending
        return {KEY_PACKING: self.packing, KEY_READER: reader}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the cursor for the loader; apply it now if the loader exists already."""
        packing = state_dict.get(KEY_PACKING, self.packing)
        if packing != self.packing:
            raise StateError(
                f"checkpoint was written with packing={packing!r} but this DataModule has "
                f"packing={self.packing!r}; the replayed packs would differ. Use "
                f"packing={packing!r} to resume, or start a fresh run."
            )
        reader = state_dict.get(KEY_READER)
        if reader is None:
            return
        if self.dataset is None:
            self._pending = reader  # no loader before setup: applied when it is built
        else:
            self._make_loader().load_state_dict(reader)
