"""``BCLDataModule``: balanced packs for Lightning (Trainer and Fabric), resumable exactly.

Only Lightning's concerns live here; the layers below do the rest: the reader is opened by
``bcl_stream.formats.open_reader.open_dataset`` (one dataset or a mixture, as ``bcl-stream
read`` opens it), batches are made by ``bcl_stream.loading.collate.PackCollate``, the cursor
is kept by ``bcl_stream.loading.loader.PackLoader``, and Mosaic Streaming's process layout is
exported by ``bcl_stream.io.streaming_compat.set_streaming_env``. What is left:

- **The trainer decides the layout.** :meth:`setup` takes the data-parallel rank and size,
  the data-parallel ranks per node (``lightning_module.trainer_layout``: a tensor-parallel
  group yields identical packs) and the gradient accumulation from the trainer, and the
  planner's layout from the collate layout (a padded batch costs B x its costliest record, a
  packed one the sum: the plan must balance the cost the batch will have). A value given
  explicitly (``ranks_per_node``, ``plan={"grad_accum": ...}``, ``plan={"layout": ...}``)
  that contradicts them is refused with one line saying which setting wins. Fabric scripts call :meth:`setup_fabric` or
  :meth:`setup_for` with the same values.
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

from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from bcl_stream.cost import resolve
from bcl_stream.epoch.checks import layout_text, require_packs
from bcl_stream.epoch.cursor import MIXTURE_CHANGES
from bcl_stream.epoch.loss_tokens import normalization
from bcl_stream.epoch.mixture_index import StreamSpec
from bcl_stream.epoch.plan import PACKINGS, PLAN_FIELDS, ReaderConfig
from bcl_stream.epoch.token_source import TokenSource
from bcl_stream.epoch.truncation import truncation
from bcl_stream.errors import StateError
from bcl_stream.formats.open_reader import open_dataset
from bcl_stream.formats.read_options import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_PREFETCH, ReadOptions
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.io.streaming_compat import set_streaming_env
from bcl_stream.loading.collate import LABELS, PackCollate
from bcl_stream.loading.evaluation import evaluation_sources
from bcl_stream.loading.loader import PackLoader
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.padded import LAYOUTS
from lightning_module.canonical import check_accumulation, shift_progress
from lightning_module.evaluation import Evaluation, EvaluationHook
from lightning_module.trainer_layout import TrainerLayout
from lightning_module.trainer_loader import TrainerPackLoader, explain_len_warning

KEY_READER = "reader"
KEY_PACKING = "packing"


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
        format: ``mds`` or ``wds`` to check the dataset's format; None (default) takes it from
            the cost index (both formats serve every scope).
        pack_size: records per pack B (the trainer's batch size: the record-count contract).
        window: packs per rank planned together W (buffer W*B records per rank).
        scope: ``rank`` | ``node`` (default) | ``world``: which ranks are balanced jointly
            (``PlanConfig.scope`` says why ``node`` is the default).
        packing: ``bcl`` (balanced) or ``sequential`` (the plain-loader baseline).
        cost_model: preset name or cost-model JSON to recompute costs from the stored token
            counts; None uses the costs written at preprocessing.
        max_tokens: memory cap M per pack (records longer than M are reported, not yielded).
        layout: ``padded`` or ``packed`` (varlen with ``cu_seqlens``): the batch layout, and so
            the cost the planner balances (``PlanConfig.layout`` follows it).
        max_seq_len: truncate records to this many tokens in collate (reported per batch, and
            at set-up); the plan costs them as truncated. A model that states a lower limit
            (``HFCausalLM.max_seq_len``) lowers it.
        labels: ``shifted`` (targets already shifted; a loss must not shift again) or
            ``unshifted`` (Hugging Face convention: the model shifts). See docs/lightning.md.
        num_workers, persistent_workers: DataLoader workers (any count gives the same packs).
        seed: shuffle seed; the epoch order is a pure function of (seed, epoch).
        shuffle: False keeps write order.
        cache_dir: local cache for a remote dataset (required for ``s3://``).
        ranks_per_node: None (default) takes the trainer's data-parallel ranks per node (devices
            per node without tensor parallelism); a value that differs is refused.
        allow_resize: resume a state saved under another world size (elastic) or refuse it.
        canonical_ranks: plan for V canonical data-parallel ranks (docs/elastic.md): the
            optimizer steps are the same at every data-parallel size R dividing V, and a
            checkpoint resumes at any such R. ``plan.grad_accum`` is then a canonical rank's
            accumulation G_c; the trainer's ``accumulate_grad_batches`` must be G_c*V/R (a
            mismatch is refused, naming the value).
        canonical_ranks_per_node: canonical ranks per node (None: the trainer's ranks per
            node); set it when the ranks per node change between runs.
        tokens_field, tokens_dtype: the column of token ids when it is not ``input_ids``
            (any name; raw integer bytes need their dtype: ``int64`` for llm-foundry's
            ``tokens``). None: the column the cost index was counted from (``annotate``).
        text_field, tokenizer: read a text column and tokenize it on the fly (``cl100k`` or a
            local ``tokenizer.json``), as ``annotate --text-field --tokenizer`` counted it; a
            source other than the one the cost index was counted from is refused.
        val_data, val_streams, test_data, test_streams: validation / test data (one dataset,
            or streams: one loader per stream, each read whole). Every record is evaluated
            once across ranks, in the same number of packs of at most ``pack_size`` records
            on every rank (docs/lightning.md, "Validation and test").
        eval_packing: ``sequential`` (write order) or ``bcl`` (packs of similar cost, steps
            balanced across ranks) for validation and test; None: ``packing``.
        cache_limit, download_timeout, prefetch: how readers fetch remote shards (MDS: passed
            to Mosaic Streaming, which owns its cache; ``bcl_stream.formats.read_options``).
        plan: any other planner knob, by ``PlanConfig`` field name (``algorithm``, ``refine``,
            ``pack_order``, ``step_fill``, ``carry``, ``carry_span``, ``stratify``,
            ``split_shards``, ``max_amplification``, ``lane``, ``lane_threshold``,
            ``shard_group``); unset ones keep PlanConfig's defaults. YAML:
            ``data.init_args.plan: {carry_span: 32}``. The knobs above with their own argument
            and ``world_size`` are refused here; ``grad_accum`` (the trainer's
            ``accumulate_grad_batches``) and ``layout`` (the collate's) may be given only
            equal to what they follow.
    """

    def __init__(
        self,
        data: str | None = None,
        *,
        streams: list[Any] | None = None,
        epoch_size: int | None = None,
        on_mixture_change: str = "refuse",
        format: str | None = None,
        pack_size: int = 8,
        window: int = 16,
        scope: str = "node",
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
        canonical_ranks: int | None = None,
        canonical_ranks_per_node: int | None = None,
        tokens_field: str | None = None,
        tokens_dtype: str | None = None,
        text_field: str | None = None,
        tokenizer: str | None = None,
        val_data: str | None = None,
        val_streams: list[Any] | None = None,
        test_data: str | None = None,
        test_streams: list[Any] | None = None,
        eval_packing: str | None = None,
        cache_limit: int | str | None = None,
        download_timeout: float = DEFAULT_DOWNLOAD_TIMEOUT,
        prefetch: int = DEFAULT_PREFETCH,
        plan: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        given = {"tokens_field": tokens_field, "tokens_dtype": tokens_dtype}
        given.update(text_field=text_field, tokenizer=tokenizer)
        self.tokens = TokenSource.of({k: v for k, v in given.items() if v is not None})
        self.options = ReadOptions(
            cache_limit=cache_limit, download_timeout=download_timeout, prefetch=prefetch
        )
        self.evaluation = Evaluation(
            sources={
                "val": evaluation_sources("val", val_data, val_streams),
                "test": evaluation_sources("test", test_data, test_streams),
            },
            packing=packing if eval_packing is None else eval_packing,
            options=self.options,
            cache_dir=cache_dir,
            num_workers=num_workers,
            collate_for=self.collate_for,
        )
        self.plan = check_plan_knobs(plan, pack_size=pack_size, window=window, scope=scope)
        if (data is None) == (streams is None):
            raise ValueError("give BCLDataModule either data (one dataset) or streams (a mixture)")
        if streams is not None:
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
        if format not in (None, "mds", "wds"):
            raise ValueError(f"format must be 'mds', 'wds' or None, got {format!r}")
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if self.plan.get("layout", layout) != layout:
            raise ValueError(
                f"plan.layout={self.plan['layout']!r} contradicts layout={layout!r}: the planner "
                "balances the cost of the batches the collate makes, so the collate layout wins; "
                "drop plan.layout"
            )
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
        self.canonical_ranks, self.canonical_ranks_per_node = (
            canonical_ranks,
            canonical_ranks_per_node,
        )
        self.dataset: PlanDataset | None = None
        self.layout_used: TrainerLayout | None = None
        """The trainer's layout the plan follows (set by ``setup``)."""
        self._loader: TrainerPackLoader | None = None
        self._announced = False
        self.fed_max_seq_len: int | None = max_seq_len
        """Tokens a record is fed at most: ``max_seq_len``, or the model's limit where it states
        one (``HFCausalLM.max_seq_len``) and it is lower (set by ``setup``)."""
        self.normalization: str | None = None
        """Where each step's loss denominator comes from: ``plan`` (batches carry
        ``step_loss_tokens``), ``all_reduce`` (``rank_step_loss_tokens``) or ``rescale`` (set by
        ``setup``; ``bcl_stream/epoch/loss_tokens.py``, docs/sft.md)."""
        self._setup_notes: list[str] = []

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
            own = self.max_seq_len
            self.fed_max_seq_len = limit if own is None else min(own, limit)

    def setup_layout(self, layout: TrainerLayout) -> None:
        """Build the dataset under ``layout``, refusing explicit settings that contradict it."""
        config = self.reader_config(layout)
        set_streaming_env(layout.local_processes)  # physical: see trainer_layout's docstring
        self.dataset = open_dataset(
            self.data,
            self.streams,
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
        canonical = self.canonical_ranks is not None
        for name, given, wins, source in (
            ("ranks_per_node", self.ranks_per_node, layout.ranks_per_node,
             "data-parallel ranks per node"),
            ("plan.grad_accum", None if canonical else self.plan.get("grad_accum"),
             layout.grad_accum, "accumulate_grad_batches"),
        ):  # fmt: skip
            if given is not None and wins is not None and given != wins:
                raise ValueError(
                    f"BCLDataModule {name}={given} contradicts the trainer's {source} ({wins}); "
                    f"the trainer's setting wins: remove {name} (or change the trainer)"
                )
        knobs = {**self.plan, "layout": self.layout}
        if layout.grad_accum is not None and not canonical:
            knobs["grad_accum"] = layout.grad_accum
        config = ReaderConfig.build(
            world_size=layout.world_size,
            pack_size=self.pack_size,
            window=self.window,
            ranks_per_node=layout.ranks_per_node,
            scope=self.scope,
            seed=self.seed,
            shuffle=self.shuffle,
            max_tokens=self.max_tokens,
            cost_model=self.cost_model,
            max_seq_len=self.fed_max_seq_len,
            packing=self.packing,
            tokens=self.tokens,  # None: the cost index's own source (the readers resolve it)
            canonical_ranks=self.canonical_ranks,
            canonical_ranks_per_node=self.canonical_ranks_per_node,
            **knobs,
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
            self.layout,
            self.fed_max_seq_len,
            self.labels,
            step_records=self.pack_size if self.plan.get("contract") == "step" else None,
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
                f"{self.pack_size} records per rank in epoch {plan.epoch} on "
                f"{layout_text(ds.config.plan.world_size, ds.config.plan.ranks_per_node)}"
                f"{groups}; "
                f"records of that epoch not yielded, by reason: {counts or 'none'}; "
                + "; ".join(self._setup_notes)
            )
        return loader

    val_dataloader = EvaluationHook("val")
    """One loader of every validation record, once across ranks (``val_data``: one;
    ``val_streams``: one per stream); no such hook without validation data."""
    test_dataloader = EvaluationHook("test")
    """One loader of every test record, once across ranks (see ``val_dataloader``)."""

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
                num_workers=self.num_workers,
                persistent_workers=self.persistent_workers,
                collate_fn=self.collate(),
                allow_resize=self.allow_resize,
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
