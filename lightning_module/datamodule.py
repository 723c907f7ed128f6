"""``BCLDataModule``: balanced packs for Lightning (Trainer and Fabric), resumable exactly.

Only Lightning's concerns live here; the layers below do the rest: the reader is opened by
``bcl_stream.formats.open_dataset.open_dataset`` (one dataset or a mixture, as ``bcl-stream
read`` opens it), batches are made by ``bcl_stream.loading.collate.PackCollate``, the cursor
is kept by ``bcl_stream.loading.loader.PackLoader``, and Mosaic Streaming's process layout is
exported by ``bcl_stream.io.streaming_compat.set_streaming_env``. What is left:

- **The trainer decides the layout.** :meth:`setup` takes the data-parallel rank and size,
  the data-parallel ranks per node (``lightning_module.trainer_layout``: a tensor-parallel
  group yields identical packs) and the gradient accumulation from the trainer, and the
  planner's cost layout from ``batch.collate`` (a padded batch costs B x its costliest
  record, a packed one the sum: the plan must balance the cost the batch will have); none of
  them is an argument. The flat ``ranks_per_node`` and ``plan={"grad_accum": ...}`` of
  earlier releases are still checked: one that contradicts the trainer is refused with one
  line saying which setting wins. Fabric scripts call :meth:`setup_fabric` or
  :meth:`setup_for` with the same values.
- **Arguments in groups** (``lightning_module/options.py``): ``plan``, ``batch``, ``loader``,
  ``read``, ``tokens``, ``eval``, ``elastic``, each a dataclass declaring its keys once;
  docs/config.md lists every YAML key and why the nesting is what it is.
- **One cursor, saved twice.** The loader owns the cursor. Lightning saves the loader's
  ``state_dict()`` and restores it before ``iter()``, except under bug #20550
  (``configure_optimizers`` reading ``trainer.estimated_stepping_batches`` with ``max_epochs``
  set): then the loader state is silently dropped and the run restarts the epoch. The
  DataModule's ``state_dict`` is restored in every case (after ``setup``, before
  ``configure_optimizers``), so it returns the loader's cursor too and its ``load_state_dict``
  hands it straight to the loader; it keeps no copy. Loading the same cursor twice is harmless.
  docs/lightning.md ("State") gives the whole order.
- **A ``sequential`` baseline through the same reader path** (``packing="sequential"``, a
  planning strategy of the core: ``ReaderConfig.packing``, ``bcl-stream plan --packing``): the
  next B records of the rank's share of the same epoch order, what a plain loader does. Only
  the plan differs, so a measured difference between the two is the planner's doing.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from bcl_stream.cost import resolve
from bcl_stream.epoch.checks import layout_text, require_packs
from bcl_stream.epoch.cursor import MIXTURE_CHANGES
from bcl_stream.epoch.loss_tokens import normalization
from bcl_stream.epoch.mixture_index import StreamSpec
from bcl_stream.epoch.plan import PACKINGS, ReaderConfig
from bcl_stream.epoch.truncation import truncation
from bcl_stream.errors import StateError
from bcl_stream.formats.open_dataset import open_dataset
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.io.streaming_compat import set_streaming_env
from bcl_stream.loading.collate import PackCollate
from bcl_stream.loading.evaluation import evaluation_sources
from bcl_stream.loading.loader import PackLoader
from bcl_stream.planner.config import PlanKnobs
from bcl_stream.planner.contracts import contract
from bcl_stream.records.source import RecordSource
from lightning_module.canonical import check_accumulation, shift_progress
from lightning_module.evaluation import Evaluation, EvaluationHook
from lightning_module.options import (
    BatchOptions,
    ConfigError,
    ElasticOptions,
    EvalOptions,
    LoaderOptions,
    apply_moved,
    group,
    moved_keys,
    plan_layout_keys,
    warn_moved,
)
from lightning_module.trainer_layout import TrainerLayout
from lightning_module.trainer_loader import TrainerPackLoader, explain_len_warning

KEY_READER = "reader"
KEY_PACKING = "packing"


class BCLDataModule(pl.LightningDataModule):
    """Balanced, resumable training packs from a costed MDS or WebDataset dataset.

    The arguments come in groups, each a dataclass whose fields (defaults and docstrings) are
    the one declaration of its keys (``lightning_module/options.py``; docs/config.md lists
    every YAML key). A group is given as its dataclass or a dict (YAML:
    ``data.plan.window: 8``). What the trainer decides (data-parallel size and rank, ranks per
    node, gradient accumulation) is taken from it at :meth:`setup`, never given here.

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
        format: ``mds`` or ``wds`` to check the dataset's format; None (default) takes it from
            the cost index (both formats serve every scope).
        packing: ``bcl`` (balanced) or ``sequential`` (the plain-loader baseline).
        cost_model: preset name or cost-model JSON to recompute costs from the stored token
            counts; None uses the costs written at preprocessing.
        seed: shuffle seed; the epoch order is a pure function of (seed, epoch).
        cache_dir: local cache for a remote dataset (required for ``s3://``).
        plan: the planner's knobs (``bcl_stream.planner.config.PlanKnobs``): ``pack_size``
            (the record-count contract B), ``window``, ``scope``, ``max_tokens``, ``shuffle``
            and the rest, each with PlanKnobs' default; not ``layout``, which follows
            ``batch.collate`` (a PlanKnobs instance's ``layout`` is ignored).
        batch: the collate's ``collate`` (``padded`` or ``packed`` tensors), ``max_seq_len``
            and ``labels`` (``BatchOptions``).
        loader: DataLoader ``num_workers`` and ``persistent_workers`` (``LoaderOptions``).
        read: how readers fetch remote shards: ``cache_limit``, ``download_timeout``,
            ``prefetch`` (``bcl_stream.formats.read_options.ReadOptions``; MDS: passed to
            Mosaic Streaming, which owns its cache).
        tokens: the column of token ids when it is not the one the cost index was counted
            from, or a text column and its tokenizer (``bcl_stream.records.source``); a
            source other than the cost index's is refused.
        eval: validation and test data and their packing (``EvalOptions``).
        elastic: resuming on another data-parallel size (``ElasticOptions``, docs/elastic.md).
        **moved: the flat arguments of earlier releases (``window``, ``num_workers``, ...):
            read with a warning naming the new key (``lightning_module.options.moved_keys``).
    """

    val_dataloader = EvaluationHook("val")
    """One loader of every validation record, once across ranks (``eval.val_data``: one;
    ``eval.val_streams``: one per stream); no such hook without validation data."""
    test_dataloader = EvaluationHook("test")
    """One loader of every test record, once across ranks (see ``val_dataloader``)."""

    def __init__(
        self,
        data: str | None = None,
        *,
        streams: list[Any] | None = None,
        epoch_size: int | None = None,
        on_mixture_change: str = "refuse",
        format: str | None = None,
        packing: str = "bcl",
        cost_model: str | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
        plan: dict[str, Any] | PlanKnobs | None = None,
        batch: BatchOptions | dict[str, Any] | None = None,
        loader: LoaderOptions | dict[str, Any] | None = None,
        read: ReadOptions | dict[str, Any] | None = None,
        tokens: RecordSource | dict[str, Any] | None = None,
        eval: EvalOptions | dict[str, Any] | None = None,
        elastic: ElasticOptions | dict[str, Any] | None = None,
        **moved: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(moved) - set(inspect.signature(moved_keys).parameters))
        if unknown:
            raise TypeError(
                f"BCLDataModule got unknown arguments {unknown}; docs/config.md lists every key"
            )
        old = moved_keys(**moved)
        plan, old = plan_layout_keys(plan, elastic, old)
        warn_moved(old)
        groups = apply_moved(
            {
                "plan": group(plan, PlanKnobs, "plan"),
                "batch": group(batch, BatchOptions, "batch"),
                "loader": group(loader, LoaderOptions, "loader"),
                "read": group(read, ReadOptions, "read"),
                "tokens": group(tokens, RecordSource, "tokens"),
                "eval": group(eval, EvalOptions, "eval"),
                "elastic": group(elastic, ElasticOptions, "elastic"),
            },
            old,
        )
        self.plan: PlanKnobs = groups["plan"]
        self.batch: BatchOptions = groups["batch"]
        followed = old.get("plan_layout", self.batch.collate)
        if followed != self.batch.collate:
            raise ConfigError(
                f"plan.layout={followed!r} contradicts layout={self.batch.collate!r} "
                "(batch.collate): the planner balances the cost of the batches the collate "
                "makes, so the collate's layout wins; drop plan.layout"
            )
        self.loader_options: LoaderOptions = groups["loader"]
        self.options: ReadOptions = groups["read"]
        self.tokens = RecordSource.of(groups["tokens"])
        self.elastic: ElasticOptions = groups["elastic"]
        self.ranks_per_node: int | None = old.get("ranks_per_node")
        """Only from an earlier release's flat argument: checked against the trainer."""
        self._old_grad_accum: int | None = old.get("grad_accum")
        """Only from an earlier release's ``plan.grad_accum``: checked against the trainer."""
        evaluation: EvalOptions = groups["eval"]
        if (data is None) == (streams is None):
            raise ConfigError("give BCLDataModule either data (one dataset) or streams (a mixture)")
        if streams is not None:
            if not isinstance(streams, list | tuple) or not streams:
                raise ConfigError(f"streams must be a non-empty list, got {streams!r}")
            streams = [StreamSpec.of(x).to_dict() for x in streams]  # refuse bad specs now
        elif epoch_size is not None:
            raise ConfigError("epoch_size applies to a mixture (streams) only")
        if on_mixture_change not in MIXTURE_CHANGES:
            raise ConfigError(
                f"on_mixture_change must be one of {MIXTURE_CHANGES}, got {on_mixture_change!r}"
            )
        if format not in (None, "mds", "wds"):
            raise ConfigError(f"format must be 'mds', 'wds' or None, got {format!r}")
        if packing not in PACKINGS:
            raise ConfigError(f"packing must be one of {PACKINGS}, got {packing!r}")
        if cost_model is not None:
            resolve(cost_model)  # fail now, with the preset list, not inside a worker
        self.data, self.streams, self.epoch_size = data, streams, epoch_size
        self.on_mixture_change, self.format = on_mixture_change, format
        self.packing, self.cost_model, self.seed, self.cache_dir = (
            packing,
            cost_model,
            seed,
            cache_dir,
        )
        self.evaluation = Evaluation(
            sources={
                "val": evaluation_sources("val", evaluation.val_data, evaluation.val_streams),
                "test": evaluation_sources("test", evaluation.test_data, evaluation.test_streams),
            },
            packing=packing if evaluation.packing is None else evaluation.packing,
            options=self.options,
            cache_dir=cache_dir,
            num_workers=self.loader_options.num_workers,
            collate_for=self.collate_for,
        )
        self.dataset: PlanDataset | None = None
        self.layout_used: TrainerLayout | None = None
        """The trainer's layout the plan follows (set by ``setup``)."""
        self._loader: TrainerPackLoader | None = None
        self._announced = False
        self.fed_max_seq_len: int | None = self.batch.max_seq_len
        """Tokens a record is fed at most: ``max_seq_len``, or the model's limit where it states
        one (``HFCausalLM.max_seq_len``) and it is lower (set by ``setup``)."""
        self.normalization: str | None = None
        """Where each step's loss denominator comes from: ``plan`` (batches carry
        ``step_loss_tokens``), ``all_reduce`` (``rank_step_loss_tokens``) or ``rescale`` (set by
        ``setup``; ``bcl_stream/epoch/loss_tokens.py``, docs/sft.md)."""
        self._setup_notes: list[str] = []

    @property
    def layout(self) -> str:
        """The batch's tensors, ``padded`` or ``packed`` (``batch.collate``), which the plan's
        cost layout follows."""
        return self.batch.collate

    # -- building -------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """Build the dataset for this rank from the trainer's layout (Lightning calls it on
        every rank; without a trainer: the process group's, or a single process)."""
        if self.dataset is None:
            trainer = getattr(self, "trainer", None)
            self.model_max_seq_len(getattr(trainer, "lightning_module", None))
            self.setup_layout(
                TrainerLayout.of_process_group()
                if trainer is None
                else TrainerLayout.of_trainer(trainer)
            )

    def setup_fabric(self, fabric: Any, grad_accum: int | None = None) -> None:
        """Build the dataset from a ``Fabric``'s layout; ``grad_accum``: the micro-batches per
        optimizer step of the script's loop (Fabric does not know it; None: ``plan``'s or 1)."""
        self.setup_layout(TrainerLayout.of_fabric(fabric, grad_accum))

    def setup_for(
        self, rank: int, world_size: int, ranks_per_node: int, grad_accum: int | None = None
    ) -> None:
        """Build the dataset for an explicit layout (Fabric scripts and tests)."""
        self.setup_layout(
            TrainerLayout(
                rank=rank,
                world_size=world_size,
                ranks_per_node=ranks_per_node,
                grad_accum=grad_accum,
            )
        )

    def model_max_seq_len(self, model: Any) -> None:
        """Feed records at most the model's ``max_seq_len`` (``HFCausalLM`` states its limit),
        or this DataModule's ``max_seq_len`` where that is lower. Call before setting up."""
        limit = getattr(model, "max_seq_len", None)
        if isinstance(limit, int) and limit >= 1:
            own = self.batch.max_seq_len
            self.fed_max_seq_len = limit if own is None else min(own, limit)

    def setup_layout(self, layout: TrainerLayout) -> None:
        """Build the dataset under ``layout``, refusing explicit settings that contradict it."""
        config = self.reader_config(layout)
        set_streaming_env(layout.local_processes)  # physical: see trainer_layout's docstring
        self.dataset = open_dataset(
            self.data if self.streams is None else self.streams,
            config,
            layout.rank,
            self.cache_dir,
            epoch_size=self.epoch_size,
            format=self.format,
            options=self.options,
        )
        self.layout_used = layout
        self._plan_what_is_trained()

    def _plan_what_is_trained(self) -> None:
        """Truncation and the loss denominator, decided once from the cost index (the same on
        every rank). Where ``max_seq_len`` cuts no record the reader config drops it, so the
        plan and the cursor are those of untruncated data (older checkpoints resume)."""
        ds = self._require_dataset()
        cut = truncation(ds.index, ds.config.max_seq_len)
        if ds.config.max_seq_len is not None and not cut.records:
            ds.config = replace(ds.config, max_seq_len=None)
        self.normalization, why = normalization(ds.index, ds.config)
        ds.step_loss_tokens = self.normalization != "rescale"
        how = {
            "plan": "step_loss_tokens from the plan, no communication",
            "all_reduce": "each rank's planned count, one all-reduce per optimizer step",
            "rescale": "the labels' count, one all-reduce per optimizer step, gradients rescaled",
        }[self.normalization]
        self._setup_notes = [cut.describe(), f"loss normalization: {how} ({why})"]

    def reader_config(self, layout: TrainerLayout) -> ReaderConfig:
        """The readers' configuration under the trainer's ``layout``: the arguments, ``plan``'s
        knobs, the trainer's world size, ranks per node and accumulation, and the collate's
        layout. An explicit value that contradicts the trainer is refused, saying which wins."""
        canonical = self.elastic.canonical_ranks is not None
        old_accum = self._old_grad_accum
        for name, given, wins, source in (
            ("ranks_per_node", self.ranks_per_node, layout.ranks_per_node,
             "data-parallel ranks per node"),
            ("plan.grad_accum", old_accum, layout.grad_accum, "accumulate_grad_batches"),
        ):  # fmt: skip
            if given is not None and wins is not None and given != wins:
                raise ValueError(
                    f"BCLDataModule {name}={given} contradicts the trainer's {source} ({wins}); "
                    f"the trainer's setting wins: remove {name} (or change the trainer)"
                )
        if canonical:
            accum = self.elastic.canonical_grad_accum or 1
        else:
            accum = layout.grad_accum or old_accum or 1
        config = ReaderConfig.build(
            **{**asdict(self.plan), "layout": self.batch.collate},
            world_size=layout.world_size,
            ranks_per_node=layout.ranks_per_node,
            grad_accum=accum,
            seed=self.seed,
            cost_model=self.cost_model,
            max_seq_len=self.fed_max_seq_len,
            packing=self.packing,
            tokens=self.tokens,  # None: the cost index's own source (the readers resolve it)
            canonical_ranks=self.elastic.canonical_ranks,
            canonical_ranks_per_node=self.elastic.canonical_ranks_per_node,
        )
        check_accumulation(config, layout.grad_accum)
        return config

    def _require_dataset(self) -> PlanDataset:
        if self.dataset is None:
            raise RuntimeError("BCLDataModule: call setup() (or setup_for()) before using it")
        return self.dataset

    def collate(self) -> PackCollate:
        """The collate function the loader uses (also handy for inspecting batches)."""
        return self.collate_for(self._require_dataset())

    def collate_for(self, dataset: PlanDataset) -> PackCollate:
        """The collate function of a reader (training, or an evaluation reader's own index)."""
        return PackCollate.for_dataset(
            dataset.index,
            self.cost_model,
            self.batch.collate,
            self.fed_max_seq_len,
            self.batch.labels,
            step_records=self.plan.pack_size if contract(self.plan.contract).step_records else None,
        )

    def train_dataloader(self) -> PackLoader:
        """One loader per DataModule: it owns the cursor, so a second call returns it again.

        Raises :class:`PlanError` when the plan gives no rank a single pack (Lightning would
        otherwise stop on "No training batches" and exit 0). The info line describes the plan
        the loader will follow, after any checkpoint's cursor (an elastic resume included).
        """
        ds = self._require_dataset()
        loader = self._make_loader()
        trainer = getattr(self, "trainer", None)
        if trainer is not None and loader.progress_shift:
            shift_progress(trainer, loader.progress_shift)
            loader.progress_shift, loader._shifted = 0, True
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
            group = 1 if self.layout_used is None else self.layout_used.group_size
            groups = f" (data-parallel ranks of {group} processes each)" if group > 1 else ""
            rank_zero_info(
                f"BCLDataModule: {self.packing} packing, {plan.n_packs} packs of "
                f"{self.plan.pack_size} records per rank in epoch {plan.epoch} on "
                f"{layout_text(ds.config.plan.world_size, ds.config.plan.ranks_per_node)}"
                f"{groups}; "
                f"records of that epoch not yielded, by reason: {counts or 'none'}; "
                + "; ".join(self._setup_notes)
            )
        return loader

    def evaluation_loaders(self, kind: str) -> list[DataLoader[Any]]:
        """The ``kind`` (``val``/``test``) loaders under the trainer's layout (after setup)."""
        self._require_dataset()
        assert self.layout_used is not None
        config = self.reader_config(self.layout_used)
        return self.evaluation.loaders(kind, config, self.layout_used.rank)

    def _make_loader(self) -> TrainerPackLoader:
        """The one loader (built once, after setup): the owner of the cursor."""
        if self._loader is None:
            explain_len_warning()
            self._loader = TrainerPackLoader(
                self._require_dataset(),
                num_workers=self.loader_options.num_workers,
                persistent_workers=self.loader_options.persistent_workers,
                collate_fn=self.collate(),
                allow_resize=self.elastic.allow_resize,
                on_mixture_change=self.on_mixture_change,
            )
        return self._loader

    def remainder_counts(self) -> dict[str, int]:
        """Records no rank yields, by reason (the same on every rank), of the epoch the loader
        last started (after training: the epoch that ran, not the next one)."""
        return self._require_dataset().remainder_counts()

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"packing", "reader"}``: the loader's cursor (None before the loader exists)."""
        reader = self._loader.state_dict() if self._loader is not None else None
        return {KEY_PACKING: self.packing, KEY_READER: reader}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Hand the cursor to the loader (the DataModule keeps no copy). Lightning restores
        after ``setup``; a Fabric script must call ``setup_fabric``/``setup_for`` before
        ``fabric.load``."""
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
            raise RuntimeError(
                "BCLDataModule.load_state_dict before setup: the loader that owns the cursor is "
                "built from the dataset. Call setup() (Fabric: setup_fabric(fabric) or "
                "setup_for(...)) first, then load the checkpoint."
            )
        self._make_loader().load_state_dict(reader)
