"""``BCLDataModule``: balanced packs for Lightning (Trainer and Fabric), resumable exactly.

Only Lightning's concerns live here; the core does the rest, as it does for a plain loop
(docs/pytorch.md): ``bcl_stream.open_training`` opens the reader (one dataset or a mixture)
through the resolve step (``bcl_stream/training/resolve.py``: truncation to the model's limit,
the planning cost of truncated records, the loss normalization path, the label convention),
batches are made by its ``PackCollate``, the cursor is kept by ``PackLoader``, and Mosaic
Streaming's process layout is exported by ``set_streaming_env``. What is left:

- **The trainer decides the layout.** :meth:`setup` takes the data-parallel rank and size,
  the data-parallel ranks per node (``lightning_module.trainer_layout``: a tensor-parallel
  group yields identical packs) and the gradient accumulation from the trainer, and the
  planner's cost layout from ``batch.collate`` (a padded batch costs B x its costliest
  record, a packed one the sum: the plan must balance the cost the batch will have); none of
  them is an argument (a ``plan`` dict naming one is refused, saying what decides it).
  Fabric scripts call :meth:`setup_fabric` or :meth:`setup_for` with the same values.
- **Arguments in groups** (``lightning_module/options.py``): ``plan``, ``batch``, ``loader``,
  ``read``, ``tokens``, ``eval``, ``elastic``, each a dataclass declaring its keys once;
  docs/config.md lists every YAML key and why the nesting is what it is. A flat key
  (``window=4``) is refused in one line naming its grouped key (``data.plan.window``).
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

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from bcl_stream import (
    BatchOptions,
    PackLoader,
    PlanDataset,
    PlanKnobs,
    ProcessLayout,
    ReadOptions,
    RecordSource,
    StateError,
    StreamSpec,
    TrainingContext,
    TrainingKnobs,
    open_training,
)
from bcl_stream.io.streaming_compat import set_streaming_env
from bcl_stream.loading.evaluation import evaluation_sources
from bcl_stream.training import (
    MIXTURE_CHANGES,
    Collate,
    ResolvedTraining,
    fed_max_seq_len,
    reader_config,
    require_packs,
)
from lightning_module.canonical import shift_progress
from lightning_module.evaluation import Evaluation, EvaluationHook
from lightning_module.options import (
    ConfigError,
    ElasticOptions,
    EvalOptions,
    KnobView,
    LoaderOptions,
    group,
    refuse_flat,
)
from lightning_module.trainer_layout import TrainerLayout
from lightning_module.trainer_loader import TrainerPackLoader, explain_len_warning

KEY_READER = "reader"
KEY_PACKING = "packing"


def _checked_sources(
    data: str | None, streams: list[Any] | None, epoch_size: int | None
) -> list[dict[str, Any]] | None:
    """``streams`` as dicts (bad specs refused now, not in a worker), after checking that
    exactly one of ``data`` and ``streams`` is given and ``epoch_size`` goes with streams."""
    if (data is None) == (streams is None):
        raise ConfigError("give BCLDataModule either data (one dataset) or streams (a mixture)")
    if streams is None:
        if epoch_size is not None:
            raise ConfigError("epoch_size applies to a mixture (streams) only")
        return None
    if not isinstance(streams, list | tuple) or not streams:
        raise ConfigError(f"streams must be a non-empty list, got {streams!r}")
    return [StreamSpec.of(x).to_dict() for x in streams]


def _checked_choices(on_mixture_change: str, format: str | None) -> None:
    """Refuse a value of the DataModule's own arguments now, in one line each (``packing`` and
    ``cost_model``: the core's ``TrainingKnobs``)."""
    if on_mixture_change not in MIXTURE_CHANGES:
        raise ConfigError(
            f"on_mixture_change must be one of {MIXTURE_CHANGES}, got {on_mixture_change!r}"
        )
    if format not in (None, "mds", "wds"):
        raise ConfigError(f"format must be 'mds', 'wds' or None, got {format!r}")


def _knobs(
    plan: dict[str, Any] | PlanKnobs | None,
    batch: BatchOptions | dict[str, Any] | None,
    tokens: RecordSource | dict[str, Any] | None,
    elastic: ElasticOptions,
    seed: int,
    cost_model: str | None,
    packing: str,
) -> TrainingKnobs:
    """The core's knobs from the DataModule's groups (each checked as its YAML spells it; a
    value the core refuses is one of our errors, printed in one line)."""
    plan_knobs, batch_options = group(plan, PlanKnobs, "plan"), group(batch, BatchOptions, "batch")
    source = RecordSource.of(group(tokens, RecordSource, "tokens"))
    try:
        return TrainingKnobs(
            plan=plan_knobs,
            batch=batch_options,
            tokens=source,
            seed=seed,
            cost_model=cost_model,
            packing=packing,
            canonical_ranks=elastic.canonical_ranks,
            canonical_ranks_per_node=elastic.canonical_ranks_per_node,
            canonical_grad_accum=elastic.canonical_grad_accum,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


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
        **flat: refused: a flat key (``window``) gets one line naming its grouped key
            (``data.plan.window``).
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
        **flat: Any,
    ) -> None:
        super().__init__()
        refuse_flat(flat)
        _checked_choices(on_mixture_change, format)
        self.elastic: ElasticOptions = group(elastic, ElasticOptions, "elastic")
        self.knobs = _knobs(plan, batch, tokens, self.elastic, seed, cost_model, packing)
        """What the user chose (the trainer's layout is ``setup``'s)."""
        self.data, self.epoch_size, self.cache_dir = data, epoch_size, cache_dir
        self.streams = _checked_sources(data, streams, epoch_size)
        self.on_mixture_change, self.format = on_mixture_change, format
        self.loader_options: LoaderOptions = group(loader, LoaderOptions, "loader")
        self.options: ReadOptions = group(read, ReadOptions, "read")
        self.evaluation = self._evaluation(group(eval, EvalOptions, "eval"))
        self._reset()

    def _evaluation(self, options: EvalOptions) -> Evaluation:
        """The validation and test passes of ``options`` (built after set-up)."""
        return Evaluation(
            sources={
                "val": evaluation_sources("val", options.val_data, options.val_streams),
                "test": evaluation_sources("test", options.test_data, options.test_streams),
            },
            packing=self.packing if options.packing is None else options.packing,
            options=self.options,
            cache_dir=self.cache_dir,
            num_workers=self.loader_options.num_workers,
            collate_for=self.collate_for,
        )

    def _reset(self) -> None:
        """Nothing set up yet: no trainer layout, no reader, no loader."""
        self._opened: PlanDataset | None = None
        self.layout_used: TrainerLayout | None = None
        """The trainer's layout the plan follows (set by ``setup``)."""
        self.resolved: ResolvedTraining | None = None
        """What the core's resolve step decided (set by ``setup``): the reader config, the
        truncation, the normalization path and the label convention."""
        self.model_limit: int | None = None
        """The model's sequence limit (``model_max_seq_len``)."""
        self._loader: TrainerPackLoader | None = None
        self._announced = False

    @property
    def dataset(self) -> PlanDataset | None:
        """The training reader (None before ``setup``): the loader's once the loader exists.
        A resume that adopts a saved canonical node size swaps the loader's reader (a reader's
        config is fixed when it is built), whether the cursor came through this DataModule's
        ``load_state_dict`` or the loader's own (a Fabric script that saves the loader); the
        reader ``setup`` opened is then no longer the one the loader moves."""
        return self._opened if self._loader is None else self._loader.plan_dataset

    # -- what the user chose (read-only views of ``knobs``) --------------------------------
    plan = KnobView[PlanKnobs]()  # the planner's knobs (data.plan)
    batch = KnobView[BatchOptions]()  # the collate's options (data.batch)
    tokens = KnobView[RecordSource | None]()  # the token source (data.tokens; None: the index's)
    packing = KnobView[str]()
    cost_model = KnobView[str | None]()
    seed = KnobView[int]()

    @property
    def layout(self) -> str:
        """The batch's tensors, ``padded`` or ``packed`` (``batch.collate``), which the plan's
        cost layout follows."""
        return self.batch.collate

    @property
    def normalization(self) -> str | None:
        """Where each step's loss denominator comes from: ``plan`` (batches carry
        ``step_loss_tokens``), ``all_reduce`` (``rank_step_loss_tokens``) or ``rescale`` (None
        before ``setup``; ``bcl_stream/training/resolve.py``, docs/sft.md)."""
        return None if self.resolved is None else self.resolved.normalization

    @property
    def fed_max_seq_len(self) -> int | None:
        """Tokens a record is fed at most: ``batch.max_seq_len``, or the model's limit where it
        states one (``HFCausalLM.max_seq_len``) and it is lower."""
        return fed_max_seq_len(self.knobs, self._context(None))

    def _context(self, layout: TrainerLayout | None) -> TrainingContext:
        """The core's training context: the trainer's layout (a single process before set-up)
        and the model's limit."""
        if layout is None:
            process = ProcessLayout(rank=0, world_size=1, ranks_per_node=1)
            return TrainingContext(process=process, max_seq_len=self.model_limit)
        return TrainingContext(
            process=layout.process, grad_accum=layout.grad_accum, max_seq_len=self.model_limit
        )

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
        optimizer step of the script's loop (Fabric does not know it; None: 1)."""
        self.setup_layout(TrainerLayout.of_fabric(fabric, grad_accum))

    def setup_for(
        self, rank: int, world_size: int, ranks_per_node: int, grad_accum: int | None = None
    ) -> None:
        """Build the dataset for an explicit layout (Fabric scripts and tests)."""
        self.setup_layout(
            TrainerLayout(
                process=ProcessLayout(
                    rank=rank, world_size=world_size, ranks_per_node=ranks_per_node
                ),
                grad_accum=grad_accum,
            )
        )

    def model_max_seq_len(self, model: Any) -> None:
        """Feed records at most the model's ``max_seq_len`` (``HFCausalLM`` states its limit),
        or this DataModule's ``max_seq_len`` where that is lower. Call before setting up."""
        limit = getattr(model, "max_seq_len", None)
        if isinstance(limit, int) and limit >= 1:
            self.model_limit = limit

    def setup_layout(self, layout: TrainerLayout) -> None:
        """Open the training reader under ``layout`` through the core's resolve step."""
        set_streaming_env(
            layout.process.local_processes
        )  # physical: see trainer_layout's docstring
        training = open_training(
            self.data if self.streams is None else self.streams,
            self.knobs,
            self._context(layout),
            self.cache_dir,
            epoch_size=self.epoch_size,
            format=self.format,
            options=self.options,
        )
        self._opened, self.resolved, self.layout_used = training.dataset, training.resolved, layout

    def _require_dataset(self) -> PlanDataset:
        if self.dataset is None:
            raise RuntimeError("BCLDataModule: call setup() (or setup_for()) before using it")
        return self.dataset

    def collate(self) -> Collate:
        """The collate function the loader uses (also handy for inspecting batches):
        ``PackCollate``, or ``ImageCollate`` around it for image-text data (the resolve
        step decides, from the index and ``batch.processor``)."""
        return self.collate_for(self._require_dataset())

    def collate_for(self, dataset: PlanDataset) -> Collate:
        """The collate function of a reader (training, or an evaluation reader's own index)."""
        self._require_dataset()
        assert self.resolved is not None
        return self.resolved.collate(dataset.index)

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
            group = 1 if self.layout_used is None else self.layout_used.process.group_size
            groups = f" (data-parallel ranks of {group} processes each)" if group > 1 else ""
            rank_zero_info(
                f"BCLDataModule: {self.packing} packing, {plan.n_packs} packs of "
                f"{self.plan.pack_size} records per rank in epoch {plan.epoch} on "
                f"{ProcessLayout.of_plan(ds.config.plan).ranks_text()}"
                f"{groups}; "
                f"records of that epoch not yielded, by reason: {counts or 'none'}; "
                + "; ".join(self.resolved.notes() if self.resolved is not None else [])
            )
        return loader

    def evaluation_loaders(self, kind: str) -> list[DataLoader[Any]]:
        """The ``kind`` (``val``/``test``) loaders under the trainer's layout (after setup)."""
        self._require_dataset()
        assert self.layout_used is not None
        config = reader_config(self.knobs, self._context(self.layout_used))
        return self.evaluation.loaders(kind, config, self.layout_used.process.rank)

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
        loader = self._make_loader()
        loader.load_state_dict(reader)  # may swap the reader (see ``dataset``)
