"""The planner's configuration and its output type (one place for every planning knob)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from bcl_stream.planner import checks
from bcl_stream.planner.contracts import contract
from bcl_stream.planner.groups import DEFAULT_SHARD_GROUP
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.planner.partition import ALGORITHMS

SCOPES = ("rank", "node", "world")
PACK_ORDERS = ("desc", "stream")
REASON_TOO_LONG = "longer_than_max_tokens"
REASON_TAIL = "epoch_tail"
MAX_RANKS = 1 << 20
"""Largest world size accepted (as in reader states): more is a typo or corruption, and
planning it would exhaust memory."""
DEFAULT_LANE = 8
"""Heavy-lane blocks of 8 windows (measured in tools/bench_scale_out.py)."""
DEFAULT_WORLD_ROW = 8
"""Scope ``world`` plans rows of at least 8 ranks: one row of 8 ranks balanced 0.99-1.00 on
real ordered corpora where 8 nodes of one rank planned apart gave 0.78-0.96
(``tools/bench_scale_out.py``)."""
MAX_SIZE = 1 << 31
"""Largest pack size, window, group or iteration count accepted."""


@dataclass(frozen=True, kw_only=True)
class PlanKnobs:
    """Every planning knob: what a user chooses, each declared here once with its default.

    The DataModule takes them as ``plan`` (YAML ``data.plan.window``), the ``plan``, ``read``
    and ``simulate`` commands as options of the same names (``commands/config_options.py``),
    the simulator as :class:`~bcl_stream.analysis.sim.SimConfig`'s inherited fields;
    docs/config.md lists them (a test checks it against these docstrings). The layout the
    trainer decides (world size, ranks per node, accumulation) is :class:`PlanConfig`'s.

    Not slotted, so that its slotted subclasses (``PlanConfig``, ``SimConfig``) list every
    field, inherited ones included, in their own ``__slots__``.
    """

    if TYPE_CHECKING:  # made by the subclasses' dataclass(slots=True), unseen by type checkers
        __slots__: ClassVar[tuple[str, ...]]

    pack_size: int = 8
    """Records per pack B: the trainer's record-count contract."""
    window: int = 16
    """Packs per rank planned together W: a rank buffers W*B records (times P for wider scopes)."""
    scope: str = "node"
    """``rank`` | ``node`` | ``world``: which ranks are balanced jointly. ``node`` (default):
    a node's ranks are partitioned jointly from the node's one stream, which balances better
    than each rank alone at no extra cost (the same shards are read, every record once; 1 node
    x 8 ranks on real corpora: 0.94 for ``rank``, 0.996 for ``node``); with one rank per node
    the two are the same plan."""
    max_tokens: int | None = None
    """Memory cap M: max tokens per pack (under ``contract="tokens"`` the token budget T of
    every micro-batch). Records longer than M go to the remainder."""
    algorithm: str = "lpt"
    """Partition algorithm (``bcl_stream.planner.partition.ALGORITHMS``); ``stream`` keeps
    stream order (the ``sequential`` baseline)."""
    refine: int = 8
    """Swap-refinement iterations after the partition (0 disables)."""
    pack_order: str = "desc"
    """Order of the packs inside a window: ``desc`` or ``stream``."""
    step_fill: bool = True
    """Give the step-mates of an unbalanceable heavy pack more work (``planner/step_fill.py``);
    scope ``world`` agrees on the heavy steps across nodes. Needs ``pack_order="desc"``."""
    carry: int | None = 0
    """Records per rank read beyond the window and possibly held back one window to steer the
    window's total cost to the epoch mean (``planner/carry.py``); None: W*B/4. Off by default:
    with the stratified shuffle every window already holds the epoch's mix, and the carry's
    lookahead shifts windows off the stratified units. Measured (tools/bench_balance.py
    corpora, 8 ranks, W=32): cross-rank CV reduction 0.980 without against 0.887 with W*B/4 on
    lmsys-like lengths, 0.966 against 0.780 on a Pareto tail. Buffer per rank = W*B + carry."""
    carry_span: int = 64
    """Windows per carry chain: the carry drains and restarts every ``carry_span`` windows, so
    a reader resuming at any window replays at most ``carry_span - 1`` hold-backs and the
    cursor holds no carry (0: one chain per epoch)."""
    shuffle: bool = True
    """False streams in write order (nodes still take disjoint spans of shards)."""
    stratify: bool = True
    """Shuffle each group so that every W*B records hold one record of every cost stratum
    (``stratify.stratified_permutation``): windows of every rank and node then carry the same mix
    of cheap and expensive records. False: a plain shuffle (what a plain loader does)."""
    split_shards: float = 0.05
    """Extra download amplification allowed for cutting the heaviest shards into pieces read by
    every node (``cuts.cut_shards``); 0 keeps every shard on one node. Measured on
    length-sorted heavy-tailed corpora (tools/bench_balance.py, 4 nodes x 8): 0.05 lifts the
    world efficiency by 3-6 points there and changes other corpora by < 0.3 points."""
    max_amplification: float = 64.0
    """Most download amplification the read policy may spend: on scope ``world``'s rows of
    several nodes (``rows_for``: rows widen only until a row holds 8 ranks and its stream two
    shard groups, so with the default a node reads about two shard groups' worth of shards,
    or 8 nodes' share, at most), then where a stream still holds fewer than two shard groups
    on cutting shards so that every node reads slices of enough shards to carry the dataset's
    mix (``planner/cuts.py``; the central peers read every shard on every node: amplification
    = nodes). Where streams hold two groups or more, ``split_shards`` applies (<= 1.05 by
    default). Chosen on the tuning corpora of ``tools/bench_scale_out.py`` (1M records): 64
    against 16 gave +1.3 to +2.1 points at 64 x 1, 64 x 8 and 128 x 8 where nodes hold 2-4
    shards. 1.0: every row on one node, no cut beyond what gives every node records."""
    layout: str = "packed"
    """How the trainer runs a pack (``planner/padded.py``): ``packed`` (varlen attention, a
    pack costs the sum of its records' costs) or ``padded`` (B x its costliest record): packs
    of similar lengths (``algorithm`` ``padded``; no sum-based refinement or step fill)."""
    lane: int = DEFAULT_LANE
    """Heavy-lane horizon in windows (``planner/heavy_lane.py``): in every block of ``lane``
    windows, aligned on every node, the W*P costliest records of the node's block move to the
    block's first window, one per pack, heaviest first; 0 or 1 turns it off. A record moves
    at most ``lane - 1`` windows and never leaves its block."""
    lane_threshold: float = 0.5
    """Only records costing more than this many mean packs (B times the epoch's mean record
    cost) enter the heavy lane: a rare record that no window can balance. Where such records
    are common (a tenth of a mixture at the length cap) the lane stays empty: concentrating a
    common class in one window would unbalance it."""
    world_row: int = DEFAULT_WORLD_ROW
    """Scope ``world``: a planning row spans the fewest whole nodes holding at least this many
    ranks, and a stream of two shard groups (``rows_for``), so nodes of few data-parallel
    ranks (tensor parallelism) or little data are balanced jointly; the row's nodes read each
    other's shards, paid from ``max_amplification`` (a row of d nodes reads its shards d
    times; 1 keeps every row on one node)."""
    shard_group: int = DEFAULT_SHARD_GROUP
    """Shards whose records a node shuffles together (``planner/groups.py``): shuffle quality
    against the shard cache (a node holds at most 2 groups)."""
    two_term_slack: float = 0.0
    """Image-text data under a two-term cost model only: how far, relative, the refinement
    that balances the vision encoder (``planner/two_term.py``) may let either term's sum of
    per-micro-batch maxima end above the token-only plan's. 0 never leaves the language term
    (or the vision term) balanced worse than a loader balancing tokens alone. On the image-text
    rows of ``tools/bench_vlm.py`` 0.001 bought at most 0.008 of vision efficiency for up to
    0.001 of language efficiency (docs/vlm.md). Text-only plans ignore it."""
    contract: str = "pack"
    """What a micro-batch holds (``planner/contracts.py``): ``pack``, exactly B records;
    ``step``, exactly G*B per rank and optimizer step, the step's records re-cut into G
    micro-batches of varying size (beyond the paper; suits the padded layout); ``tokens``,
    at most ``max_tokens`` tokens, records vary, balanced on cost, G micro-batches per step on
    every rank (``planner/token_contract.py``; packed: the records' tokens <= T, padded: rows
    x longest <= T)."""

    def __post_init__(self) -> None:
        """Check every knob's type and range; a ValueError names the field and the value."""
        checks.integer(self.lane, "lane", 0, MAX_SIZE)
        _number(self.lane_threshold, "lane_threshold", 0.0, float("inf"), ">= 0", upper=False)
        for name in ("pack_size", "window", "shard_group", "world_row"):
            checks.integer(getattr(self, name), name, 1, MAX_SIZE)
        checks.integer(self.refine, "refine", 0, MAX_SIZE)
        for name, allowed in (
            ("scope", SCOPES),
            ("algorithm", tuple(sorted(ALGORITHMS))),
            ("pack_order", PACK_ORDERS),
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.max_tokens is not None:
            checks.integer(self.max_tokens, "max_tokens", 1)
        for name in ("step_fill", "shuffle", "stratify"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.carry is not None:
            top = self.window * self.pack_size
            checks.integer(self.carry, "carry", -MAX_SIZE, MAX_SIZE)
            if not 0 <= self.carry < top:
                raise ValueError(
                    f"carry must be in [0, window*pack_size={top}) or None, got {self.carry!r}"
                )
        _number(self.split_shards, "split_shards", 0.0, 1.0, "in [0, 1]")
        _number(self.two_term_slack, "two_term_slack", 0.0, 1.0, "in [0, 1)", upper=False)
        checks.integer(self.carry_span, "carry_span", 0, MAX_SIZE)
        _number(self.max_amplification, "max_amplification", 1.0, MAX_RANKS, ">= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        promise = contract(self.contract)
        if promise.budget and self.max_tokens is None:
            raise ValueError(
                f"contract={self.contract!r} needs max_tokens, the token budget T per rank and "
                "micro-batch (for example max_tokens=16384)"
            )
        if self.layout not in promise.layouts:
            raise ValueError(
                f"contract={self.contract!r} plans the {' and '.join(promise.layouts)} layout "
                f"only, got layout={self.layout!r}"
            )

    def build(
        self, *, world_size: int, ranks_per_node: int = 1, grad_accum: int = 1, **changes: Any
    ) -> PlanConfig:
        """The planner config of these knobs under the layout the trainer decides
        (:data:`LAYOUT_FIELDS`), ``changes`` replacing knobs by name (the DataModule's cost
        ``layout`` follows its collate; a simulated strategy names its ``scope``).

        Why: the knobs stay one object from the user's YAML (or a subclass's fields, as
        ``SimConfig``'s) to the planner, built with the job's layout in one call (torchtitan's
        ``Config.build(context)``), instead of being spelled flat on the way and nested again.
        """
        knobs = {f.name: getattr(self, f.name) for f in fields(PlanKnobs)}
        unknown = sorted(set(changes) - set(knobs))
        if unknown:
            raise ValueError(f"unknown planner knobs {unknown}; the knobs are {sorted(knobs)}")
        return PlanConfig(
            **{**knobs, **changes},
            world_size=world_size,
            ranks_per_node=ranks_per_node,
            grad_accum=grad_accum,
        )

    @property
    def partition_algorithm(self) -> str:
        """The partition that serves the layout: ``padded`` for the padded layout (but for the
        unbalanced ``stream`` baseline, which keeps stream order whatever the layout)."""
        if self.layout == "padded" and self.algorithm != "stream":
            return "padded"
        return self.algorithm

    @property
    def carry_records(self) -> int:
        """Records per rank of lookahead actually used (None: W*B/4)."""
        return self.window * self.pack_size // 4 if self.carry is None else self.carry


def _number(value: object, name: str, lo: float, hi: float, what: str, upper: bool = True) -> None:
    """A real number (not a bool) in [lo, hi] (``upper=False``: [lo, hi)), or a ValueError
    saying ``name must be a number {what}``."""
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, int | float | np.integer | np.floating)
        or not (lo <= value <= hi if upper else lo <= value < hi)
    ):
        raise ValueError(f"{name} must be a number {what}, got {value!r}")


LAYOUT_FIELDS = ("world_size", "ranks_per_node", "grad_accum")
""":class:`PlanConfig`'s fields that the trainer decides (its data-parallel size, the
data-parallel ranks per node, its gradient accumulation), apart from the knobs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig(PlanKnobs):
    """Everything besides data and (seed, epoch) that decides a plan: the knobs, and the layout
    the trainer decides (:data:`LAYOUT_FIELDS`)."""

    world_size: int
    """Number of data-parallel ranks R."""
    ranks_per_node: int = 1
    """Ranks per node P; must divide ``world_size``. A node reads only its own shards."""
    grad_accum: int = 1
    """Micro-batches per optimizer step G. Above 1 (scopes node/world) the packs of each step
    are handed to ranks so that every rank's per-step sum is balanced too (DDP ``no_sync``)."""

    def __post_init__(self) -> None:
        """Check the layout, then the knobs (:meth:`PlanKnobs.__post_init__`)."""
        for name in ("world_size", "ranks_per_node"):
            checks.integer(getattr(self, name), name, 1, MAX_RANKS)
        checks.integer(self.grad_accum, "grad_accum", 1, MAX_SIZE)
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} does not divide world_size={self.world_size}"
            )
        PlanKnobs.__post_init__(self)  # explicit: slotted dataclasses break a bare super()

    @property
    def n_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def row_nodes(self) -> int:
        """Nodes of one planning row in scope ``world`` (1 in the other scopes): the smallest
        divisor d of the node count with d*P >= ``world_row``, and at most the read budget
        ``max_amplification`` (each node of a row reads the row's shards). The planner widens
        rows further where nodes hold little data (:meth:`rows_for`)."""
        return self._row_nodes(-(-self.world_row // self.ranks_per_node))

    def _row_nodes(self, want: int) -> int:
        if self.scope != "world" or want <= 1:
            return 1
        nodes = self.n_nodes
        fits = [d for d in range(1, nodes + 1) if nodes % d == 0 and d <= self.max_amplification]
        return min([d for d in fits if d >= want] or [max(fits)])

    def rows_for(self, n_shards: int) -> PlanConfig:
        """This config with the rows the data asks for (what the streams plan; identical in
        every process: it depends on the shard count alone). Scope ``world`` widens a row
        until it holds ``world_row`` ranks and its stream two shard groups (a node's share of
        a small dataset cannot carry the dataset's mix, and rows that plan jointly align
        their steps where separate nodes cannot), within the read budget: at 64 nodes x 8
        and 1M records (4 shards a node), 0.63-0.86 with a row per node against 0.94-0.99
        with rows of 16 nodes, both at amplification 16, and 0.954-0.995 with one row of 64
        nodes (``tools/bench_scale_out.py``, the corpora the defaults were chosen on). Rows only grow while data is scarce, so a process
        plans at most two shard groups' or ``world_row`` ranks' worth of rows, whatever the
        node count."""
        groups = -(-2 * self.shard_group * self.n_nodes // max(n_shards, 1))
        d = self._row_nodes(max(-(-self.world_row // self.ranks_per_node), groups))
        if d == self.row_nodes:
            return self
        return replace(self, world_row=d * self.ranks_per_node)

    @property
    def stream_nodes(self) -> int:
        """Streams of the epoch: one per node, or one per planning row of ``row_nodes``
        nodes (the row's shards are dealt to it as to one node)."""
        return self.n_nodes // self.row_nodes

    @property
    def stream_ranks(self) -> int:
        """Ranks reading one stream: P, or P * ``row_nodes``."""
        return self.ranks_per_node * self.row_nodes

    @property
    def row_ranks(self) -> int:
        """Ranks of one planning row (partitioned jointly): 1 in scope ``rank``, the node's P
        in scope ``node``, P * ``row_nodes`` in scope ``world``."""
        return 1 if self.scope == "rank" else self.stream_ranks

    @property
    def n_rows(self) -> int:
        """Planning rows of the world: one per rank, per node, or per row of nodes."""
        return self.world_size // self.row_ranks

    def row_of(self, rank: int) -> tuple[int, int]:
        """(planning row, place among the row's ranks) of ``rank``: what a reader plans."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return divmod(rank, self.row_ranks)

    @property
    def window_records(self) -> int:
        """Records one rank takes from one window, W*B."""
        return self.window * self.pack_size

    @property
    def node_window_records(self) -> int:
        """Records one stream's ranks take from one window, W*B*P (times ``row_nodes``)."""
        return self.window_records * self.stream_ranks

    def unbalanced(self) -> PlanConfig:
        """This config with balancing off, the ``sequential`` baseline's: rank scope, packs in
        stream order, no carry, no heavy lane, a plain shuffle inside shard groups, no pack
        cap (records over ``max_tokens`` are still left out, by the streams' filter)."""
        return replace(
            self,
            scope="rank",
            algorithm="stream",
            refine=0,
            pack_order="stream",
            step_fill=False,
            carry=0,
            stratify=False,
            lane=0,
            max_tokens=None,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """One epoch's packs for every rank, plus what was left out and why."""

    packs: npt.NDArray[np.int64]
    """(world_size, n_packs, pack_size) global record ids; under the tokens contract
    (world_size, n_packs, widest micro-batch), padded with -1 past each micro-batch's."""
    remainder: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    """Record ids not emitted this epoch, keyed by reason."""

    @property
    def n_packs(self) -> int:
        """Packs per rank (identical on every rank)."""
        return int(self.packs.shape[1])

    @property
    def records_used(self) -> int:
        """Records the packs hold (under the tokens contract packs are padded with -1)."""
        return int(np.count_nonzero(self.packs >= 0))

    @property
    def records_left(self) -> int:
        return int(sum(ids.size for ids in self.remainder.values()))

    def remainder_counts(self) -> dict[str, int]:
        """Reason -> count, for reports."""
        return {reason: int(ids.size) for reason, ids in self.remainder.items() if ids.size}
