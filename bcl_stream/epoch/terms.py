"""The two-term cost on the read path: what the readers balance and refine for image-text data.

Why: an image-text dataset's cost index stores the language model's c(L) alone (images enter
only as their image tokens); its components (``bcl_components.npz``) say what each record
costs the vision encoder. A reader given a two-term cost model (``ReaderConfig.cost_model``: a
preset of ``bcl_stream.vision.cost`` such as ``qwen2-vl-2b``, or its JSON) plans the language
term (the token-only balancer's plan), then exchanges records between the ranks of each node at
each micro-batch index so that the vision term and the sum are balanced too, never leaving
either term worse balanced than that plan (``planner/two_term.py``); with one rank per node
(nothing to exchange) it plans the summed cost vision + language. Every plan path (a rank's windows, the whole epoch, the first packs an elastic resume replays) applies
the same refinement to the same packs, per micro-batch index and per node, so all of them
agree without communication.

Text-only data under a two-term model is costed by its language term, and its plan is the
text plan of that model (no refinement). A mixture, and ``max_seq_len`` on image-text data
(a record with images is never cut), are refused with a two-term model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import resolve
from bcl_stream.epoch.cache import cached
from bcl_stream.errors import CostIndexError
from bcl_stream.io.index import CostIndex
from bcl_stream.planner import ShardTable, shard_weights
from bcl_stream.planner.bcl import validate_costs
from bcl_stream.planner.two_term import GUARD_WINDOWS, refine_packs
from bcl_stream.vision.components import COMPONENTS_KEY, RecordComponents, read_components
from bcl_stream.vision.cost import TwoTermCost, resolve_two_term


@dataclass(frozen=True, slots=True)
class Terms:
    """Per-record costs of both terms (by global record id) and what the refinement keeps."""

    vision: npt.NDArray[np.float64]
    language: npt.NDArray[np.float64]
    table: ShardTable
    """The shard table of the language term: what the plan refined is planned on."""
    ranks_per_node: int
    window: int
    """Micro-batches per planning window: the refinement regroups and chooses per window."""
    tokens: Any | None = None
    """Tokens per record as fed, under a token budget (None: no budget)."""
    max_tokens: int | None = None
    slack: float = 0.0
    """The guard's slack (``PlanKnobs.two_term_slack``; 0: never worse than the plan refined)."""

    @property
    def unit(self) -> int:
        """Micro-batches per unit of the refinement's guard (:data:`GUARD_WINDOWS` windows):
        every plan path refines whole units from a unit's start, so all of them agree."""
        return self.window * GUARD_WINDOWS

    def refine(self, packs: npt.NDArray[np.int64], first: int) -> npt.NDArray[np.int64]:
        """``packs`` (ranks of whole nodes, whole units from micro-batch ``first`` on, the
        epoch's last possibly short, width) refined node by node and window by window."""
        if first % self.unit:
            raise ValueError(f"micro-batch {first} does not start a unit of {self.unit}")
        return refine_packs(
            packs,
            self.vision,
            self.language,
            self.ranks_per_node,
            tokens=self.tokens,
            max_tokens=self.max_tokens,
            window=self.window,
            guard_windows=GUARD_WINDOWS,
            slack=self.slack,
        )


def index_components(index: CostIndex) -> RecordComponents | None:
    """The components ``index``'s JSON names, read beside its cost array (None: text-only)."""
    if index.extra.get(COMPONENTS_KEY) is None:
        return None
    if index.source is None:
        raise CostIndexError(
            "an in-memory cost index names image-text components but has no directory to "
            "read them from; open the dataset's directory (read_index) instead"
        )
    root = Path(index.source.path).parent
    return cached(
        ("components", index.fingerprint()),
        lambda: read_components(root, np.asarray(index.tokens)),
    )


def component_terms(
    index: CostIndex, components: RecordComponents, model: TwoTermCost
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(vision, language) per record of ``index``'s ``components`` under ``model``, made once
    per dataset and model (a reader's costs and its refinement share them)."""
    return cached(("terms", index.fingerprint(), model), lambda: model.terms(components))


def two_term_costs(
    index: Any, model: TwoTermCost, max_seq_len: int | None
) -> tuple[npt.NDArray[np.float64], RecordComponents | None]:
    """Per-record summed costs under ``model`` and the components they came from (None:
    text-only data, costed by the language term)."""
    if not isinstance(index, CostIndex):
        raise ValueError(
            f"a two-term cost model ({model.name}) plans one image-text dataset, not a "
            "mixture; give each stream a single-term cost model"
        )
    components = index_components(index)
    if components is None:
        tokens = np.asarray(index.tokens, dtype=np.int64)
        if max_seq_len is not None:
            tokens = np.minimum(tokens, max_seq_len)
        return validate_costs(model.language.cost(tokens)), None
    if max_seq_len is not None and bool((components.tokens > max_seq_len).any()):
        raise ValueError(
            f"max_seq_len={max_seq_len} would cut image-text records, and a record with images "
            "is never cut (its image tokens must match its images); raise max_seq_len or leave "
            "it unset"
        )
    vision, language = component_terms(index, components, model)
    return validate_costs(vision + language), components


def plan_terms(
    index: Any,
    cost_model: str | None,
    ranks_per_node: int,
    window: int,
    tokens: Any | None,
    max_tokens: int | None,
    slack: float = 0.0,
) -> Terms | None:
    """The terms a BCL reader refines with, or None (no two-term model, text-only data, or
    one rank per node: nothing to exchange); ``window``: micro-batches per planning window;
    ``slack``: the guard's (``PlanKnobs.two_term_slack``)."""
    model = resolve_two_term(cost_model)
    if model is None or ranks_per_node < 2 or not isinstance(index, CostIndex):
        return None  # a mixture under a two-term model is refused where its costs are made
    components = index_components(index)
    if components is None:
        return None
    vision, language = component_terms(index, components, model)
    counts = index.shard_counts
    table = cached(
        ("terms_table", index.fingerprint(), model),
        lambda: ShardTable.build(counts, weight=shard_weights(counts, language)),
    )
    budget = tokens if max_tokens is not None else None
    return Terms(vision, language, table, ranks_per_node, window, budget, max_tokens, slack)


def record_costs(index: Any, cost_model: str | None) -> Any:
    """Per-record costs a reader config's ``cost_model`` gives (by global record id): the
    summed two-term cost for a two-term model, else the stored costs or those of the
    single-term model named (``CostIndex.costs``, a mixture's view)."""
    two_term = resolve_two_term(cost_model)
    if two_term is not None:
        return two_term_costs(index, two_term, None)[0]
    return index.costs(None if cost_model is None else resolve(cost_model))
