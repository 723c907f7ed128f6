"""The resolve step: the knobs, the trainer's context and the opened index in; everything the
readers and the collate need out (the reader config, truncation, planning costs of truncated
records, the loss normalization path and the label convention).

Why in the core: these rules decide what each rank trains on. Decided in one trainer adapter
only, a plain ``PackLoader`` user (torchrun, Hugging Face Accelerate or Trainer) got none of
them, and the same record could be planned at one cost and trained at another depending on the
entry point. ``BCLDataModule`` and a plain loop both call :func:`open_training` (or
:func:`reader_config` then :func:`resolve`), so both plan and feed the same records alike.

What is decided, once, identically on every rank (from the shared cost index):

- **Truncation.** Records are fed at most min(``batch.max_seq_len``, the model's limit)
  tokens; longer ones are planned at their truncated cost (``epoch/truncation.py``). Where
  the limit cuts no record the reader config drops it (``ReaderConfig.fitted``, which every
  reader is built with), so the plan and the cursor are those of untruncated data (a
  checkpoint of untruncated data resumes).
- **Normalization.** Where each optimizer step's loss denominator comes from
  (``epoch/loss_tokens.py``): ``plan`` (batches carry ``step_loss_tokens``, no
  communication), ``all_reduce`` (``rank_step_loss_tokens``, one scalar all-reduce per step)
  or ``rescale`` (the labels' count, one all-reduce, gradients rescaled).
- **Accumulation.** The trainer's, or G_c under canonical ranks, whose physical accumulation
  G_c x V/R is checked against the trainer's.
- **Images.** Image-text data (an index with ``extra.vision``, written by ``preprocess
  --processor``) is collated by ``ImageCollate`` with ``batch.processor``, so the images are
  decoded and processed in the DataLoader workers and the batch carries the model's keys; a
  truncation that would cut such data is refused (a record's image tokens must match its
  images).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bcl_stream.epoch.loss_tokens import normalization
from bcl_stream.epoch.plan import PlanData, ReaderConfig
from bcl_stream.epoch.truncation import Truncation, truncation
from bcl_stream.errors import DatasetError
from bcl_stream.formats.open_dataset import open_dataset
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.reader_base import PlanDataset
from bcl_stream.io.index_meta import INDEX_JSON
from bcl_stream.loading.collate import PackCollate
from bcl_stream.loading.loader import PackLoader
from bcl_stream.planner.contracts import contract
from bcl_stream.training.context import TrainingContext
from bcl_stream.training.knobs import TrainingKnobs
from bcl_stream.vision.batch import ImageCollate
from bcl_stream.vision.fingerprint import FINGERPRINT_KEY, processor_fingerprint
from bcl_stream.vision.preprocess import VISION_KEY

HOW = {
    "plan": "step_loss_tokens from the plan, no communication",
    "all_reduce": "each rank's planned count, one all-reduce per optimizer step",
    "rescale": "the labels' count, one all-reduce per optimizer step, gradients rescaled",
}
"""Each normalization path in one phrase (the set-up line)."""

Collate = Callable[[list[dict[str, Any]]], dict[str, Any]]
"""A batch of a pack: ``PackCollate``, or ``ImageCollate`` around it for image-text data."""


def fed_max_seq_len(knobs: TrainingKnobs, context: TrainingContext) -> int | None:
    """Tokens a record is fed at most: ``batch.max_seq_len``, or the model's limit where it
    states one and it is lower."""
    own, model = knobs.batch.max_seq_len, context.max_seq_len
    if model is None:
        return own
    return model if own is None else min(own, model)


def reader_config(knobs: TrainingKnobs, context: TrainingContext) -> ReaderConfig:
    """The readers' configuration before the index is read: the knobs under the trainer's
    layout, the plan's cost layout following the collate's. Refuses a trainer accumulation
    that canonical ranks contradict."""
    canonical = knobs.canonical_ranks is not None
    accum = (knobs.canonical_grad_accum or 1) if canonical else (context.grad_accum or 1)
    config = ReaderConfig.build(
        **{**asdict(knobs.plan), "layout": knobs.batch.collate},
        world_size=context.process.world_size,
        ranks_per_node=context.process.ranks_per_node,
        grad_accum=accum,
        seed=knobs.seed,
        cost_model=knobs.cost_model,
        max_seq_len=fed_max_seq_len(knobs, context),
        packing=knobs.packing,
        tokens=knobs.tokens,  # None: the cost index's own source (the readers resolve it)
        canonical_ranks=knobs.canonical_ranks,
        canonical_ranks_per_node=knobs.canonical_ranks_per_node,
    )
    check_accumulation(config, context.grad_accum)
    return config


def check_accumulation(config: ReaderConfig, accumulate: int | None) -> None:
    """Refuse a trainer accumulation that is not G_c * V/R, saying in one line what to set."""
    if config.canonical_ranks is None or accumulate is None:
        return
    want = config.micro_batches_per_step
    if accumulate != want:
        raise ValueError(
            f"accumulate_grad_batches={accumulate} but canonical_ranks={config.canonical_ranks} "
            f"on {config.plan.world_size} data-parallel ranks with plan.grad_accum="
            f"{config.plan.grad_accum} runs {want} micro-batches per optimizer step: set "
            f"accumulate_grad_batches={want} (the global batch stays {config.canonical_ranks} x "
            f"{config.plan.grad_accum} packs)"
        )


@dataclass(frozen=True, slots=True)
class ResolvedTraining:
    """What the readers and the collate follow, decided once from the knobs, the context and
    the cost index (the same on every rank)."""

    config: ReaderConfig
    """The readers' config: ``max_seq_len`` None where it cuts no record."""
    max_seq_len: int | None
    """Tokens a record is fed at most (the collate truncates to it; evaluation readers too)."""
    truncation: Truncation
    """What ``max_seq_len`` cuts from the training data."""
    normalization: str
    """``plan``, ``all_reduce`` or ``rescale`` (module docstring)."""
    why: str
    """Why that path (one phrase)."""
    labels: str
    """The batches' label convention: ``shifted`` or ``unshifted`` (the model shifts)."""
    processor: str | None = None
    """The processor directory of image-text data (``batch.processor``); None: text."""

    @property
    def step_loss_tokens(self) -> bool:
        """Whether the readers attach each step's planned count (not on ``rescale``)."""
        return self.normalization != "rescale"

    def notes(self) -> list[str]:
        """Phrases for a set-up line: the truncation and the normalization path."""
        how = HOW[self.normalization]
        return [self.truncation.describe(), f"loss normalization: {how} ({self.why})"]

    def collate(self, index: PlanData) -> Collate:
        """The collate of a reader over ``index`` (training, or an evaluation reader's own):
        ``PackCollate``, wrapped in ``ImageCollate`` for image-text data."""
        plan = self.config.plan
        base = PackCollate.for_dataset(
            index,
            self.config.cost_model,
            plan.layout,
            self.max_seq_len,
            self.labels,
            step_records=plan.pack_size if contract(plan.contract).step_records else None,
        )
        if self.processor is None or image_processor(index) is None:
            return base
        return ImageCollate(base, self.processor)


def resolve(knobs: TrainingKnobs, context: TrainingContext, index: PlanData) -> ResolvedTraining:
    """The resolve step (module docstring): pure, the same on every rank."""
    config = reader_config(knobs, context)
    fed = config.max_seq_len
    cut = truncation(index, fed)
    config = config.fitted(index)
    how, why = normalization(index, config)
    processor = checked_processor(index, collate_processor(knobs), cut)
    return ResolvedTraining(config, fed, cut, how, why, knobs.batch.labels, processor)


def collate_processor(knobs: TrainingKnobs) -> str | None:
    """The processor the image collate uses: ``batch.processor``, else the one the records are
    read in place with (``tokens.processor``), so that one directory is named once; two
    different ones are refused (one line naming both)."""
    batch = knobs.batch.processor
    tokens = knobs.tokens.processor if knobs.tokens is not None else None
    if batch is not None and tokens is not None and batch != tokens:
        raise DatasetError(
            f"batch.processor={batch!r} but tokens.processor={tokens!r}: the records would be "
            "encoded with one processor and their images processed with another; give one "
            "(batch.processor may be left out: it defaults to tokens.processor)"
        )
    return batch if batch is not None else tokens


def image_processor(index: PlanData) -> str | None:
    """The processor name image-text data was preprocessed with (its index's
    ``extra.vision``; a mixture: its first image-text stream's), or None for text."""
    vision = _vision(index)
    return None if vision is None else str(vision.get("processor", "?"))


def _vision(index: PlanData) -> dict[str, Any] | None:
    """``extra.vision`` of image-text data (a mixture: its first image-text stream's)."""
    for one in getattr(index, "indexes", (index,)):
        vision = getattr(one, "extra", {}).get(VISION_KEY)
        if isinstance(vision, dict):
            return vision
    return None


def _check_fingerprint(index: PlanData, processor: str, name: str) -> None:
    """Refuse (one line naming both) a processor directory whose content differs from the
    one the data was preprocessed with; warn once where the index predates fingerprints."""
    vision = _vision(index) or {}
    stored = vision.get(FINGERPRINT_KEY)
    source = getattr(getattr(index, "source", None), "path", None)
    where = str(Path(source).with_name(INDEX_JSON)) if source else "the data's cost index"
    if stored is None:
        warnings.warn(
            f"{where}: its extra.vision has no {FINGERPRINT_KEY} (written before processors "
            f"were fingerprinted), so batch.processor={processor!r} is matched by the collate's "
            "image-token count only; re-run `bcl-stream annotate --processor DIR` (or "
            "preprocess) to record it",
            UserWarning,
            stacklevel=3,
        )
        return
    try:
        mine = processor_fingerprint(processor)
    except ValueError as exc:
        raise DatasetError(f"batch.processor={processor!r}: {exc}") from exc
    if mine != stored:
        raise DatasetError(
            f"batch.processor={processor!r} (processor_sha256 {mine[:16]}) is not the "
            f"processor the data was preprocessed with ({name}, processor_sha256 "
            f"{str(stored)[:16]} in {where}): its tokenizer, chat template or "
            "preprocessor_config.json differ; give that processor's directory, or re-run "
            "preprocess/annotate with this one"
        )


def checked_processor(index: PlanData, processor: str | None, cut: Truncation) -> str | None:
    """``batch.processor`` where the data holds images; refused (one line) where image-text
    data has none, text data has one, or the fed length would cut records."""
    name = image_processor(index)
    if name is None:
        if processor is not None:
            raise DatasetError(
                f"batch.processor={processor!r} but the data holds no image-text records (its "
                "index has no extra.vision); drop batch.processor"
            )
        return None
    if processor is None:
        raise DatasetError(
            f"the data holds image-text records (preprocessed with --processor {name}): set "
            "batch.processor to that processor directory, so the collate can process the images"
        )
    if not os.path.isfile(os.path.join(processor, "preprocessor_config.json")):
        raise DatasetError(
            f"batch.processor={processor!r}: no preprocessor_config.json there; give the local "
            f"processor directory the data was preprocessed with ({name})"
        )
    _check_fingerprint(index, processor, name)
    if cut.records:
        raise DatasetError(
            f"image-text data: {cut.describe()}; a record with images is never cut (its image "
            "tokens would no longer match its images): raise batch.max_seq_len (and the "
            "model's limit) or drop long records at preprocess (--outliers drop)"
        )
    return processor


@dataclass(frozen=True, slots=True)
class Training:
    """One rank's training reader and what it was resolved to."""

    dataset: PlanDataset
    resolved: ResolvedTraining

    def collate(self) -> Collate:
        """The training batches' collate."""
        return self.resolved.collate(self.dataset.index)

    def loader(self, **kwargs: Any) -> PackLoader:
        """A ``PackLoader`` over the reader with the resolved collate (``kwargs``: the
        loader's, e.g. ``num_workers``)."""
        return PackLoader(self.dataset, collate_fn=self.collate(), **kwargs)


def open_training(
    data: str | os.PathLike[str] | Sequence[Any] | None,
    knobs: TrainingKnobs,
    context: TrainingContext,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    epoch_size: int | None = None,
    format: str | None = None,
    options: ReadOptions | None = None,
) -> Training:
    """Open ``data`` (one dataset or a mixture, as :func:`~bcl_stream.open_dataset`) for
    training under ``context``, resolved: the reader follows the resolved config and attaches
    each step's planned count where the plan knows it."""
    dataset = open_dataset(
        data,
        reader_config(knobs, context),
        context.process.rank,
        cache_dir,
        epoch_size=epoch_size,
        format=format,
        options=options,
    )
    resolved = resolve(knobs, context, dataset.index)  # the reader was fitted alike
    dataset.step_loss_tokens = resolved.step_loss_tokens
    return Training(dataset, resolved)
