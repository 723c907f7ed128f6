"""The plan both readers follow: (cost index, reader config, epoch) -> every rank's packs.

Readers follow :class:`ReaderPlan`: pack count and remainder from the shard table, a rank's
packs planned lazily a batch of windows at a time, so no process holds the epoch's plan.
:func:`~bcl_stream.epoch.full_plan.full_plan` materializes the same plan for every rank at
once, for ``bcl-stream plan``, tools and tests. Both walk the planner's one path
(``planner.bcl.iter_windows``), for BCL and for the ``sequential`` baseline alike, so what a
loader yields is by construction what ``bcl-stream plan`` prints.

Elastic resume: a checkpoint taken after ``k`` packs under world size R, resumed under R',
records the old plan as a :class:`Segment`. The records of the first ``k`` packs of every old
rank are consumed; the rest of the epoch's order is re-planned for R'. Segments chain, so a
second change of world size in the same epoch works the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.cost import resolve
from bcl_stream.epoch.cache import cached
from bcl_stream.epoch.canonical_config import check_canonical
from bcl_stream.epoch.mixture_index import MixtureIndex
from bcl_stream.epoch.process_group import launcher_ranks_per_node, process_group
from bcl_stream.epoch.terms import Terms, plan_terms, two_term_costs
from bcl_stream.epoch.truncation import fed_costs, fed_tokens, truncation
from bcl_stream.errors import StateError
from bcl_stream.io.index import CostIndex
from bcl_stream.planner import (
    Plan,
    PlanConfig,
    ShardTable,
    build_node_streams,
    build_token_streams,
    iter_windows,
    plan_streams,
    shard_weights,
)
from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG
from bcl_stream.planner.contracts import contract
from bcl_stream.planner.mixture import EpochDraw
from bcl_stream.planner.token_contract import (
    EMPTY,
    REASON_OVER_BUDGET,
    TokenWalker,
    plan_tokens,
    planning_window,
)
from bcl_stream.process_layout import ProcessLayout
from bcl_stream.records.source import RecordSource
from bcl_stream.vision.cost import resolve_two_term

log = logging.getLogger(__name__)

REASON_CONSUMED = "consumed_before_resize"

PlanData = CostIndex | MixtureIndex
"""What a plan is made from: one dataset's cost index, or a mixture of several."""


def epoch_draw(index: PlanData, config: ReaderConfig, epoch: int) -> EpochDraw | None:
    """A mixture's draw of ``epoch`` (None for one dataset: every record, once)."""
    if isinstance(index, MixtureIndex):
        return index.draw(config.seed, epoch)
    return None


def epoch_records(index: PlanData, draw: EpochDraw | None) -> int:
    """Records the epoch holds before any filter (a mixture: its draw)."""
    return len(index) if draw is None else int(draw.usable.sum())


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderConfig:
    """Everything besides the data, the rank and the epoch that decides what a reader yields:
    the planner's :class:`PlanConfig` (every planning knob and its default, in one place) plus
    what only readers need. ``ReaderConfig.build(world_size=..., pack_size=..., window=...)``
    spells the planner fields flat."""

    plan: PlanConfig
    """Every planning knob (``bcl_stream.planner.config.PlanConfig``)."""
    seed: int = 0
    """Shuffle seed; the epoch order is a pure function of (seed, epoch)."""
    cost_model: str | None = None
    """Preset name or JSON path to recompute costs from tokens; None uses the stored costs."""
    packing: str = "bcl"
    """``bcl`` (balanced packs) or ``sequential`` (the baseline: each rank's next B records of
    the same epoch order, what a plain loader yields). Both follow the same node streams."""
    tokens: RecordSource | None = None
    """Where records' token ids come from (``records/source.py``); None: the ``input_ids``
    column bcl-stream writes. Recorded in the cursor: a resume reads the same ids."""
    max_seq_len: int | None = None
    """Tokens a record is fed at most (the collate truncates to it): longer records are
    planned at their truncated cost (``epoch/truncation.py``). None: records are fed whole.
    Recorded in the cursor when set (the plan depends on it)."""
    canonical_ranks: int | None = None
    """V canonical data-parallel ranks (``epoch/canonical.py``): the epoch is planned for V
    ranks, whatever the physical size R (``plan.world_size``, which must divide V); each
    physical rank runs the packs of V/R canonical ranks as accumulation micro-batches, so the
    optimizer steps are the same at every R. ``plan.grad_accum`` is then a canonical rank's
    accumulation G_c (the trainer's is G_c*V/R). None: the plan is made for the R ranks."""
    canonical_ranks_per_node: int | None = None
    """Canonical ranks per canonical node (a canonical node's shards are read together; a
    physical node reads those of the canonical nodes it hosts). None: not pinned: a resume
    adopts the value its cursor recorded, a fresh run takes the physical
    ``plan.ranks_per_node`` (:attr:`canonical_node_ranks`; the cursor records the value
    used). A value given that contradicts the cursor's is refused on resume, naming both."""

    def __post_init__(self) -> None:
        if self.max_seq_len is not None and (
            isinstance(self.max_seq_len, bool)
            or not isinstance(self.max_seq_len, int)
            or self.max_seq_len < 1
        ):
            raise ValueError(
                f"max_seq_len must be an integer >= 1 or None, got {self.max_seq_len!r}"
            )
        check_canonical(self.plan, self.canonical_ranks, self.canonical_ranks_per_node)
        if self.tokens is not None and not isinstance(self.tokens, RecordSource):
            raise ValueError(f"tokens must be a RecordSource or None, got {self.tokens!r}")
        if self.tokens is not None:
            self.tokens.checked()
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        if not isinstance(self.plan, PlanConfig):
            raise ValueError(f"plan must be a PlanConfig, got {type(self.plan).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.cost_model is not None and not isinstance(self.cost_model, str):
            raise ValueError(f"cost_model must be a string or None, got {self.cost_model!r}")

    @classmethod
    def build(
        cls,
        *,
        seed: int = 0,
        cost_model: str | None = None,
        packing: str = "bcl",
        tokens: RecordSource | None = None,
        max_seq_len: int | None = None,
        canonical_ranks: int | None = None,
        canonical_ranks_per_node: int | None = None,
        **plan_fields: Any,
    ) -> ReaderConfig:
        """A config from flat keyword arguments: ``plan_fields`` are :class:`PlanConfig`'s.

        ``world_size`` left out: the initialised torch process group's size (one process a
        data-parallel rank); without a process group it is required. A ``world_size`` given
        wins (with tensor or context parallelism it is the data-parallel size, which divides
        the group; the reader refuses one that contradicts the group). With the world size
        taken from the group, ``ranks_per_node`` left out is the launcher's
        ``LOCAL_WORLD_SIZE`` where it sets one (torchrun does), not 1: one 8-GPU node is one
        node of 8 ranks, as the job runs.
        """
        unknown = set(plan_fields) - PLAN_FIELDS
        if unknown:
            raise ValueError(
                f"unknown reader config fields {sorted(unknown)}; planner fields are "
                f"{sorted(PLAN_FIELDS)}, plus seed, cost_model and packing"
            )
        if "world_size" not in plan_fields:
            group = process_group()
            if group is None:
                raise ValueError(
                    "world_size is required: no torch process group is initialised to take it "
                    "from (give world_size=..., or build the config after init_process_group)"
                )
            plan_fields["world_size"] = group.world_size
            if "ranks_per_node" not in plan_fields:
                local = launcher_ranks_per_node(group.world_size)
                if local is not None:
                    plan_fields["ranks_per_node"] = local
        return cls(
            plan=PlanConfig(**plan_fields),
            seed=seed,
            cost_model=cost_model,
            packing=packing,
            tokens=RecordSource.of(tokens),
            max_seq_len=max_seq_len,
            canonical_ranks=canonical_ranks,
            canonical_ranks_per_node=canonical_ranks_per_node,
        )

    def flat(self) -> dict[str, Any]:
        """Every field by name, planner fields included (for comparisons and messages)."""
        return {
            **asdict(self.plan),
            "seed": self.seed,
            "cost_model": self.cost_model,
            "packing": self.packing,
            "tokens": None if self.tokens is None else self.tokens.to_dict(),
            "max_seq_len": self.max_seq_len,
            "canonical_ranks": self.canonical_ranks,
            "canonical_ranks_per_node": self.canonical_node_ranks,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly nested form (stored in reader states): ``{plan: {...}, seed,
        cost_model, packing}``, plus ``tokens`` when they are not the stored ``input_ids`` and
        ``max_seq_len`` when records are truncated."""
        out: dict[str, Any] = {
            "plan": asdict(self.plan),
            "seed": self.seed,
            "cost_model": self.cost_model,
            "packing": self.packing,
        }
        if self.tokens is not None:
            out["tokens"] = self.tokens.to_dict()
        if self.max_seq_len is not None:
            out["max_seq_len"] = self.max_seq_len
        if self.canonical_ranks is not None:
            out["canonical_ranks"] = self.canonical_ranks
            out["canonical_ranks_per_node"] = self.canonical_node_ranks
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReaderConfig:
        """Inverse of :meth:`to_dict`; unknown keys and the old flat layout are errors."""
        if "plan" not in data and PLAN_FIELDS & set(data):
            raise ValueError(
                "reader config has the old flat layout (planner fields such as "
                f"{sorted(PLAN_FIELDS & set(data))[:3]} at the top level); this release nests "
                "them under 'plan'. Resume with the bcl-stream release that wrote it, or drop "
                "the data loader's state from the checkpoint to start the epoch over"
            )
        unknown = set(data) - {"plan", *CONFIG_KEYS}
        if unknown:
            raise ValueError(f"reader config has unknown keys {sorted(unknown)}")
        plan = data.get("plan")
        if not isinstance(plan, dict):
            raise ValueError(f"reader config 'plan' must be a dict, got {type(plan).__name__}")
        unknown = set(plan) - PLAN_FIELDS
        if unknown:
            raise ValueError(f"reader config 'plan' has unknown keys {sorted(unknown)}")
        rest = {k: v for k, v in data.items() if k not in ("plan", "tokens")}
        return cls(plan=PlanConfig(**plan), tokens=RecordSource.of(data.get("tokens")), **rest)

    def resized(self, layout: ProcessLayout) -> ReaderConfig:
        """The same config under another layout's world size and ranks per node (elastic
        resume)."""
        plan = replace(
            self.plan, world_size=layout.world_size, ranks_per_node=layout.ranks_per_node
        )
        return replace(self, plan=plan)

    @property
    def hosted(self) -> int:
        """Canonical ranks one physical rank runs, V/R (1 without ``canonical_ranks``)."""
        if self.canonical_ranks is None:
            return 1
        return self.canonical_ranks // self.plan.world_size

    @property
    def canonical_node_ranks(self) -> int | None:
        """The canonical node size the plan uses: ``canonical_ranks_per_node``, or where it is
        not pinned the physical ``plan.ranks_per_node`` (None without ``canonical_ranks``)."""
        if self.canonical_ranks is None:
            return None
        return self.canonical_ranks_per_node or self.plan.ranks_per_node

    @property
    def micro_batches_per_step(self) -> int:
        """Micro-batches of one optimizer step on a physical rank: G, or G_c*V/R."""
        return self.plan.grad_accum * self.hosted

    def fitted(self, index: PlanData) -> ReaderConfig:
        """This config as a reader of ``index`` is built with: ``max_seq_len`` None where it
        cuts no record, so that the plan and the cursor are those of untruncated data (a
        checkpoint of untruncated data resumes). Decided before the reader holds a config,
        which it then never rewrites."""
        if self.max_seq_len is None or truncation(index, self.max_seq_len).records:
            return self
        return replace(self, max_seq_len=None)

    def canonical(self) -> ReaderConfig:
        """The config the canonical plan is made under: V ranks, ``canonical_ranks_per_node``
        per node, no physical layout left in it (so its plan, and its cache key, is the same at
        every physical size). Without ``canonical_ranks``: this config."""
        if self.canonical_ranks is None:
            return self
        plan = replace(
            self.plan,
            world_size=self.canonical_ranks,
            ranks_per_node=self.canonical_ranks_per_node or self.plan.ranks_per_node,
        )
        return replace(self, plan=plan, canonical_ranks=None, canonical_ranks_per_node=None)


PACKINGS = ("bcl", "sequential")
"""Planning strategies a reader follows, by name (``ReaderConfig.packing``)."""
CONFIG_KEYS = (
    "seed", "cost_model", "packing", "tokens", "max_seq_len", "canonical_ranks",
    "canonical_ranks_per_node",
)  # fmt: skip
"""A nested reader config's keys besides ``plan``."""
PLAN_FIELDS = frozenset(f.name for f in fields(PlanConfig))
"""The planner's field names (``ReaderConfig.build`` keywords, ``to_dict()["plan"]`` keys)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """An earlier plan of the current epoch, cut after ``packs_consumed`` packs per rank."""

    world_size: int
    ranks_per_node: int
    packs_consumed: int

    @property
    def layout(self) -> ProcessLayout:
        """The layout the earlier plan was made for."""
        return ProcessLayout(world_size=self.world_size, ranks_per_node=self.ranks_per_node)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One epoch's plan plus the records consumed by earlier segments (elastic resume)."""

    plan: Plan
    """Packs of shape (world_size, n_packs, pack_size) and the remainder by reason."""
    epoch: int
    consumed: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))
    """Record ids consumed under earlier world sizes this epoch (not in ``plan``)."""

    @property
    def n_packs(self) -> int:
        """Packs per rank, identical on every rank."""
        return self.plan.n_packs

    def rank_packs(self, rank: int) -> npt.NDArray[np.int64]:
        """(n_packs, pack_size) record ids of one rank."""
        if not 0 <= rank < self.plan.packs.shape[0]:
            raise ValueError(f"rank must be in [0, {self.plan.packs.shape[0]}), got {rank}")
        return self.plan.packs[rank]

    def remainder_counts(self) -> dict[str, int]:
        """Reason -> count of records this plan does not yield (consumed ones included)."""
        counts = self.plan.remainder_counts()
        if self.consumed.size:
            counts[REASON_CONSUMED] = int(self.consumed.size)
        return counts


class ReaderPlan:
    """One epoch's plan as a reader process needs it, computed window by window.

    Building it costs O(shards): the pack count and the remainder counts come from the shard
    table; a rank's packs are planned a batch of windows at a time as the reader reaches them
    (its own row only: its rank, or in scopes ``node``/``world`` its node), so nothing per
    process grows with the dataset beyond the mapped cost index, and time to the first pack
    does not depend on the epoch's length. A start in mid-epoch replays at most one carry span
    of hold-backs (``PlanConfig.carry_span``), never the epoch. ``packing="sequential"`` walks
    the same streams with balancing off.
    """

    def __init__(
        self,
        index: PlanData,
        config: ReaderConfig,
        epoch: int,
        segments: tuple[Segment, ...] = (),
    ) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if segments and config.packing == "sequential":
            raise StateError(
                "packing='sequential' cannot resume a state saved under another world size "
                "(elastic resume is a BCL feature); resume with the original world size."
            )
        self.epoch = epoch
        self.config = config
        self.consumed = _consumed(index, config, epoch, segments)
        costs, table = costs_and_table(index, config)
        self._tokens = (
            None if config.plan.max_tokens is None else fed_tokens(index, config.max_seq_len)
        )
        self._terms: Terms | None = None
        if config.packing == "bcl":  # image-text data under a two-term model (epoch/terms.py)
            self._terms = plan_terms(
                index,
                config.cost_model,
                config.plan.ranks_per_node,
                planning_window(config.plan),
                self._tokens,
                config.plan.max_tokens,
                config.plan.two_term_slack,
            )
        if self._terms is not None:  # planned on the language term, then refined
            costs, table = self._terms.language, self._terms.table
        self._costs = costs
        draw = epoch_draw(index, config, epoch)
        self._tokens_walker: TokenWalker | None = None
        streams_kwargs: dict[str, Any] = {
            "seed": config.seed,
            "epoch": epoch,
            "excluded": self.consumed if self.consumed.size else None,
            "draw": draw,
            "balanced": config.packing == "bcl",
        }
        if contract(config.plan.contract).budget:
            assert self._tokens is not None  # a budget contract needs max_tokens
            self._streams = build_token_streams(
                costs, table, config.plan, tokens=self._tokens, **streams_kwargs
            )
            self._tokens_walker = TokenWalker(self._streams, costs, self._tokens, config.plan)
        else:
            self._streams = build_node_streams(
                costs, table, config.plan, tokens=self._tokens, **streams_kwargs
            )
        # Records the filter removed are the too-long ones plus the consumed ones that were not
        # too long: derived from the table the streams already built (no second pass).
        removed = epoch_records(index, draw) - int(self._streams.table.usable.sum())
        short_consumed = int(self.consumed.size)
        if self._tokens is not None and config.plan.max_tokens is not None:
            long = np.asarray(self._tokens[self.consumed]) > config.plan.max_tokens
            short_consumed -= int(np.count_nonzero(long))
        self._too_long = removed - short_consumed

    @property
    def n_packs(self) -> int:
        """Packs (micro-batches) per rank, identical on every rank."""
        if self._tokens_walker is not None:
            return self._tokens_walker.n_packs
        return self._streams.n_packs

    def remainder_counts(self) -> dict[str, int]:
        """Reason -> count of records this epoch does not yield (consumed ones included).

        Under the tokens contract the records that end a carry chain unplaced
        (``over_token_budget``) are known only once their windows are planned: ``whole()``
        holds them, and a reader warns with their count as it walks past them."""
        streams = self._streams
        usable = int(streams.table.usable.sum())
        emitted = streams.n_packs * streams.config.world_size * streams.config.pack_size
        counts = {
            REASON_TAIL: usable - emitted,
            REASON_TOO_LONG: self._too_long,
            REASON_CONSUMED: int(self.consumed.size),
        }
        return {reason: n for reason, n in counts.items() if n}

    def iter_rank_packs(
        self, rank: int, start: int = 0, group: bool = False
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(index of the first pack, packs (n, B)) of ``rank`` from pack ``start`` on, a batch
        of windows at a time; ``group``: the packs of its planning row, (row_ranks, n, B)
        (the ranks that share its node's stream: the ``step`` contract deals among them)."""
        row, _ = self._streams.config.row_of(rank)
        row_ranks = self._streams.config.row_ranks
        if group:
            yield from self._walk(list(range(row * row_ranks, (row + 1) * row_ranks)), start)
            return
        for first, packs in self._walk([rank], start):
            yield first, packs[0]

    def first_packs(self, k: int) -> npt.NDArray[np.int64]:
        """(world_size, k, pack_size): the first ``k`` packs of every rank, from the first
        ceil(k / W) windows of every row (elastic resume: what the ranks of an old world size
        consumed). Cost O(k * world_size * B), not O(epoch)."""
        if not 0 <= k <= self.n_packs:
            raise ValueError(f"segment consumed {k} packs but its plan has {self.n_packs}")
        rows = list(range(self._streams.n_rows))
        unit = 1 if self._terms is None else self._terms.unit
        whole = min(-(-k // unit) * unit, self.n_packs)  # whole units: refined as read
        parts = [packs for _, packs in self._units(self._batches(rows, 0, whole))]
        if not parts:
            width = self.config.plan.pack_size
            return np.empty((self.config.plan.world_size, 0, width), dtype=np.int64)
        return _joined(parts)[:, :k]

    def iter_ranks_packs(
        self, ranks: list[int], start: int = 0
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(index of the first pack, packs (len(ranks), n, B)) of several ranks from pack
        ``start`` on, planning only their rows (canonical ranks hosted by one physical rank:
        ``epoch/canonical.py``); under the tokens contract (len(ranks), n, widest), padded
        with ``EMPTY``."""
        yield from self._walk(ranks, start)

    def _walk(self, ranks: list[int], start: int) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """The one walk of the rank-level methods: plan the rows holding ``ranks`` (with the
        two-term refinement in scope ``rank``: every row of their nodes, whose ranks it
        exchanges records between), refine whole units of it, and keep ``ranks``' packs."""
        config = self._streams.config
        places = [config.row_of(r) for r in ranks]
        rows = self._planned_rows(sorted({row for row, _ in places}))
        take = [rows.index(row) * config.row_ranks + place for row, place in places]
        unit = 1 if self._terms is None else self._terms.unit
        begin = start - start % unit  # a two-term unit is refined whole, from its start
        for first, packs in self._units(self._batches(rows, begin)):
            skip = max(start - first, 0)
            if skip < packs.shape[1]:
                yield first + skip, packs[take, skip:]

    def _batches(
        self, rows: list[int], start: int, stop: int | None = None
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """(first micro-batch, packs of ``rows``) as planned, unrefined, from the window
        holding micro-batch ``start`` to the one holding ``stop - 1`` (None: the epoch's
        end)."""
        if self._tokens_walker is not None:
            per_window = self._tokens_walker.per_window
            end = None if stop is None else -(-stop // per_window)
            for tb in self._tokens_walker.walk(rows, start // per_window, end):
                _warn_over_budget(tb.dropped, rows)
                yield tb.first_pack, tb.packs
            return
        window = self.config.plan.window
        end = None if stop is None else -(-stop // window)
        for batch in iter_windows(
            self._streams, self._costs, self._tokens, rows, start // window, end
        ):
            yield batch.first_pack, batch.packs

    def _units(
        self, batches: Iterator[tuple[int, npt.NDArray[np.int64]]]
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """``batches`` (from a unit's start) joined into whole units of the two-term
        refinement and refined (``epoch/terms.py``), the epoch's last unit possibly short;
        unchanged without it."""
        if self._terms is None:
            yield from batches
            return
        unit, first = self._terms.unit, 0
        held: list[npt.NDArray[np.int64]] = []
        for at, packs in batches:
            if not held:
                first = at
            held.append(packs)
            end = at + packs.shape[1]
            if end % unit == 0 or end >= self.n_packs:
                yield first, self._refined(_joined(held), first)
                held = []
        if held:
            yield first, self._refined(_joined(held), first)

    def _planned_rows(self, rows: list[int]) -> list[int]:
        """``rows``, or under the two-term refinement in scope ``rank`` (a row is one rank)
        every row of the nodes that hold them."""
        row_ranks = self._streams.config.row_ranks
        if self._terms is None or row_ranks % self._terms.ranks_per_node == 0:
            return rows
        per_node = self._terms.ranks_per_node // row_ranks
        return sorted({r - r % per_node + i for r in rows for i in range(per_node)})

    def _refined(self, packs: npt.NDArray[np.int64], first: int = 0) -> npt.NDArray[np.int64]:
        """``packs`` of whole nodes and whole windows from micro-batch ``first`` on, after the
        two-term refinement (unchanged without it)."""
        return packs if self._terms is None else self._terms.refine(packs, first)

    def rank_packs(self, rank: int) -> npt.NDArray[np.int64]:
        """(n_packs, pack_size) record ids of one rank (materialized: tools and tests); under
        the tokens contract (n_packs, widest), padded with ``EMPTY``."""
        parts = [packs for _, packs in self.iter_rank_packs(rank)]
        if not parts:
            return np.empty((0, self.config.plan.pack_size), dtype=np.int64)
        return _joined(parts)

    def whole(self) -> EpochPlan:
        """Every rank's packs and the remainder's ids, materialized (``full_plan``). Under the
        tokens contract the packs are padded with ``EMPTY`` (-1) past each micro-batch's
        records."""
        if self._tokens_walker is not None:
            streams = self._streams
            packs, dropped = plan_tokens(self._tokens_walker)
            tails = [streams.tail(n) for n in range(len(streams.nodes))]
            remainder = {REASON_TAIL: np.concatenate(tails), REASON_OVER_BUDGET: dropped}
            if streams.keep is not None:
                remainder[REASON_TOO_LONG] = streams.keep.too_long()
            return EpochPlan(Plan(self._refined(packs), remainder), self.epoch, self.consumed)
        plan = plan_streams(self._streams, self._costs, self._tokens)
        if self._terms is not None:
            plan = Plan(self._refined(plan.packs), plan.remainder)
        return EpochPlan(plan, self.epoch, self.consumed)


def _consumed(
    index: PlanData, config: ReaderConfig, epoch: int, segments: tuple[Segment, ...]
) -> npt.NDArray[np.int64]:
    """Records consumed this epoch under earlier world sizes (elastic resume), sorted.

    Only the windows an old plan's ranks reached are planned (``ReaderPlan.first_packs``):
    resuming one pack into an epoch costs about a fresh plan, whatever the epoch's length
    (``tools/bench_elastic.py``)."""
    consumed = np.empty(0, dtype=np.int64)
    for i, seg in enumerate(segments):
        old = config.resized(seg.layout)
        old_plan = reader_plan(index, old, epoch, segments[:i])  # excludes what came before
        steps = old.plan.grad_accum
        if contract(old.plan.contract).recut_steps and seg.packs_consumed % steps:
            raise StateError(
                f"contract={old.plan.contract!r}: the state was saved after {seg.packs_consumed} micro-batches, "
                f"inside an optimizer step of {steps}, and the world size changed; a step's "
                "records are re-cut across its micro-batches, so only a state saved at a step "
                "boundary resumes on another world size (Lightning saves there), or resume on "
                f"{seg.world_size} ranks"
            )
        taken = old_plan.first_packs(seg.packs_consumed).ravel()
        consumed = np.union1d(old_plan.consumed, taken[taken != EMPTY])
    return consumed


def reader_plan(
    index: PlanData,
    config: ReaderConfig,
    epoch: int,
    segments: tuple[Segment, ...] = (),
) -> ReaderPlan:
    """The plan readers follow, lazy (in the per-process plan cache,
    :mod:`bcl_stream.epoch.cache`)."""
    if config.canonical_ranks is not None:
        raise ValueError(
            "a config with canonical_ranks is planned by bcl_stream.epoch.canonical."
            "canonical_plan (reader_plan plans config.canonical())"
        )
    key = ("reader", index.fingerprint(), config, epoch, segments)
    return cached(key, lambda: ReaderPlan(index, config, epoch, segments))


def costs_and_table(index: PlanData, config: ReaderConfig) -> tuple[Any, ShardTable]:
    """Per-record costs and the shard table (mean cost per shard), once per data, model and
    ``max_seq_len`` (in the plan cache): records longer than ``max_seq_len`` at their truncated
    cost. For a mixture the costs are a view over its streams' indexes (each its own cost
    model)."""

    def make() -> tuple[Any, ShardTable]:
        two_term = resolve_two_term(config.cost_model)
        if two_term is not None:  # image-text data: vision + language (epoch/terms.py)
            costs, _ = two_term_costs(index, two_term, config.max_seq_len)
            counts = index.shard_counts
            return costs, ShardTable.build(counts, weight=shard_weights(counts, costs))
        model = None if config.cost_model is None else resolve(config.cost_model)
        if isinstance(index, MixtureIndex):
            models = index.stream_models(model)
            view = fed_costs(index, models, index.costs(model), config.max_seq_len)
            return view, index.shard_table(view)
        costs = fed_costs(index, [model], index.costs(model), config.max_seq_len)
        counts = index.shard_counts
        return costs, ShardTable.build(counts, weight=shard_weights(counts, costs))

    key = ("table", index.fingerprint(), config.cost_model, config.max_seq_len)
    return cached(key, make)


def _joined(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """Consecutive packs ((ranks,) n, width) joined along the micro-batch axis, narrower ones
    padded with ``EMPTY`` (the tokens contract's micro-batches vary in width)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.shape[-1] for p in parts)
    pad = [(0, 0)] * (parts[0].ndim - 1)
    return np.concatenate(
        [np.pad(p, [*pad, (0, width - p.shape[-1])], constant_values=EMPTY) for p in parts],
        axis=-2,
    )


def _warn_over_budget(dropped: npt.NDArray[np.int64], row: int | list[int]) -> None:
    """Report records that ended a carry chain unplaced (``over_token_budget``) in planning
    ``row`` (or rows)."""
    if dropped.size:
        log.warning(
            "planning row %s: %d records found no room under max_tokens before their carry "
            "chain ended and are left out of this epoch (%s; first ids %s): raise carry_span "
            "(0: one chain per epoch) or max_tokens",
            row,
            dropped.size,
            REASON_OVER_BUDGET,
            dropped[:5].tolist(),
        )
