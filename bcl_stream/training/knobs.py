"""What a user chooses about training data, nested as the YAML nests it: the planner's knobs
(:class:`~bcl_stream.planner.config.PlanKnobs`), the batch's (:class:`BatchOptions`), the token
source, and the rest of a reader's choices. What the trainer decides (the data-parallel
layout, the accumulation, the model's sequence limit) is not here: it is the
:class:`~bcl_stream.training.context.TrainingContext`, and :func:`~bcl_stream.training.resolve.resolve`
composes the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bcl_stream.cost import resolve as resolve_cost_model
from bcl_stream.epoch.plan import PACKINGS
from bcl_stream.loading.collate import LABELS
from bcl_stream.planner.config import PlanKnobs
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.records.source import RecordSource
from bcl_stream.vision.cost import resolve_two_term


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
    processor: str | None = None
    """A local Hugging Face processor directory, for image-text data (``preprocess
    --processor``): the collate decodes each record's images in the DataLoader workers and adds
    the model's keys (``pixel_values``, ``image_grid_thw``; docs/vlm.md). Required for
    image-text data (None: ``tokens.processor`` where the records are read in place with one),
    refused for text."""

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
class TrainingKnobs:
    """Every choice that decides what a rank trains on, apart from the trainer's layout."""

    plan: PlanKnobs = field(default_factory=PlanKnobs)
    """The planner's knobs; its ``layout`` is ignored: the plan's cost layout follows
    ``batch.collate``."""
    batch: BatchOptions = field(default_factory=BatchOptions)
    """The collate's layout, truncation and label convention."""
    tokens: RecordSource | None = None
    """Where token ids come from; None: the cost index's own source."""
    seed: int = 0
    """Shuffle seed; the epoch order is a pure function of (seed, epoch)."""
    cost_model: str | None = None
    """Preset name or cost-model JSON to recompute costs from token counts; None: stored."""
    packing: str = "bcl"
    """``bcl`` (balanced) or ``sequential`` (the plain-loader baseline)."""
    canonical_ranks: int | None = None
    """Plan for V canonical data-parallel ranks (docs/elastic.md); None: the trainer's."""
    canonical_ranks_per_node: int | None = None
    """Canonical ranks per node (None: the cursor's on a resume, else the trainer's)."""
    canonical_grad_accum: int | None = None
    """A canonical rank's accumulation G_c (None: 1); only with ``canonical_ranks``."""

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        if self.cost_model is not None and resolve_two_term(self.cost_model) is None:
            resolve_cost_model(self.cost_model)  # fail now, with the presets, not in a worker
