"""Balance simulator: plan an epoch under every strategy and score it with the metrics of
docs/metrics.md (``analysis/metrics.py``), plus download amplification and the shard working
set (:func:`locality`): the sum over nodes of the distinct shards its ranks read / distinct
shards read, and the most distinct shards one node's ranks read within one window of W packs
(what its cache must hold at once). Speedups are per unit of cost (:func:`speedups`), since
strategies may leave different records unused.

The record array is the dataset in write order, cut into shards of ``shard_records``. BCL and
``sequential`` read node streams (each node its own shards); central baselines read one global
shuffle (``bcl_stream.peers.global_order``), as a trainer's shuffled DataLoader does.

The pooled peers (the registry ``bcl_stream.peers.PEERS``: ``nemo_mffd``, ``verl_kk``,
``verl_dynbsz``, ``pooled_mffd_split``, ``hf_rebalance``) pool global batches of R*B*G records
from that global shuffle.

Contract (``SimConfig.contract``): under ``step`` (padded layout) the BCL steps are dealt
within each node and each rank's step re-cut into micro-batches of varying size
(``planner/step_contract.py``), as readers yield them; under ``tokens`` the BCL strategies
cut micro-batches of at most ``max_tokens`` tokens (``planner/token_contract.py``), the budget
the token peers (``verl_dynbsz``, ``nemo_mffd``, ``pooled_mffd_split``) pack to as well
(``sequential`` stays the record contract's plain loader).

Time model: ``overhead`` is an absolute cost added to every micro-batch; ``micro_batch_overhead``
F prices a micro-batch at F times the cost of a full-budget micro-batch of mean-length records
(:func:`micro_batch_price`): FSDP gathers the parameters and launches the same kernels whatever
a micro-batch holds, which favours fewer, fuller micro-batches. :func:`budget_figures` gives
the token contract's figures (tokens per micro-batch, micro-batches per rank, useful cost).

Layout (``SimConfig.layout``, ``planner/padded.py``): a pack costs the sum of its records'
costs when ``packed`` (varlen attention), B times its costliest record when ``padded``. With
``padded``, BCL plans with the ``padded`` partition (similar lengths together, no sum-based
refinement or step fill).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.displacement import displacement_steps
from bcl_stream.analysis.metrics import Metrics, imbalance_sq, metrics_from_costs
from bcl_stream.cost import CostModel
from bcl_stream.peers import (
    PEERS,
    REAL_PEERS,
    Pool,
    global_order,
    micro_batches_per_batch,
    plan_pooled,
    rename_hint,
)
from bcl_stream.planner.bcl import build_node_streams, plan_epoch, plan_streams, validate_costs
from bcl_stream.planner.canonical import physical_packs
from bcl_stream.planner.config import PlanConfig, PlanKnobs
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.padded import Packs, check_layout, ragged_pack_costs
from bcl_stream.planner.shard_table import Draw, ShardTable, shard_weights
from bcl_stream.planner.step_contract import node_micro_batches
from bcl_stream.planner.token_contract import (
    fill,
    mean_fed_tokens,
    planning_window,
)
from bcl_stream.planner.two_term import GUARD_WINDOWS, refine_packs

STRATEGIES = ("sequential", *PEERS, "bcl-rank", "bcl-node", "bcl-world")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig(PlanKnobs):
    """One simulated setting (the ``bcl-stream simulate`` flags).

    The planner's knobs are :class:`~bcl_stream.planner.config.PlanKnobs`'s own fields,
    inherited with their defaults and docstrings (one declaration), except ``scope``: each BCL
    strategy names its own (``bcl-rank``/``bcl-node``/``bcl-world``), so a ``scope`` other than
    the default is refused. Below: the simulated job's layout (8 ranks on one node, G=4: the
    trainer's in a real run, :data:`~bcl_stream.planner.config.LAYOUT_FIELDS`) and the
    simulator's own settings. ``max_tokens`` is also the bin capacity of ``nemo_mffd`` /
    ``pooled_mffd_split`` and the token budget of ``verl_dynbsz``; None there:
    max(longest, B*mean).
    """

    ranks: int = 8
    """Data-parallel ranks (``PlanConfig.world_size``)."""
    ranks_per_node: int = 8
    grad_accum: int = 4
    sync: str = "microbatch"
    seed: int = 0
    epoch: int = 0
    overhead: float = 0.0
    shard_records: int = 4096
    """The dataset in write order is cut into shards of this many records."""
    canonical_ranks: int | None = None
    """BCL strategies plan for this many canonical ranks and run them on ``ranks`` physical
    ranks (``epoch/canonical.py``); ``grad_accum`` stays the physical accumulation, so a
    canonical rank's is ``grad_accum * ranks / canonical_ranks``. None: plan for ``ranks``."""
    canonical_ranks_per_node: int | None = None
    """Canonical ranks per node (None: ``ranks_per_node``)."""
    micro_batch_overhead: float = 0.0
    """Fixed price of every micro-batch as a fraction of the cost of a full-budget
    micro-batch of mean-length records (``max_tokens``, or the default capacity, over the mean
    length; :func:`micro_batch_price`), added to ``overhead`` (absolute)."""

    def __post_init__(self) -> None:
        PlanKnobs.__post_init__(self)  # explicit: slotted dataclasses break a bare super()
        if self.scope != SIM_SCOPE:
            raise ValueError(
                f"SimConfig.scope={self.scope!r}: the simulator sets the scope per strategy "
                "(bcl-rank, bcl-node, bcl-world); leave scope unset"
            )
        if not (
            isinstance(self.micro_batch_overhead, int | float) and self.micro_batch_overhead >= 0
        ):
            raise ValueError(
                f"micro_batch_overhead must be a number >= 0, got {self.micro_batch_overhead!r}"
            )
        if self.shard_records < 1:
            raise ValueError(f"shard_records must be >= 1, got {self.shard_records}")
        v = self.canonical_ranks
        if v is not None and (v % self.ranks or (self.grad_accum * self.ranks) % v):
            raise ValueError(
                f"canonical_ranks={v} needs ranks dividing it and grad_accum*ranks a multiple "
                f"of it (a canonical rank's accumulation), got ranks={self.ranks}, "
                f"grad_accum={self.grad_accum}"
            )


SIM_SCOPE = next(f.default for f in fields(PlanKnobs) if f.name == "scope")
"""The one ``scope`` a SimConfig holds: PlanKnobs' default (the strategies set their own)."""


def default_capacity(tokens: npt.NDArray[np.integer], pack_size: int) -> int:
    """Bin capacity when none is given: a bin holds what an average pack of B holds, at least
    the longest record (so every record fits)."""
    tok = np.asarray(tokens)
    return int(max(int(tok.max()), int(np.ceil(pack_size * tok.mean()))))


@dataclass(frozen=True, slots=True)
class Schedule:
    """One strategy's epoch: the packs, their (ranks, packs) cost matrix and record accounting."""

    pack_costs: npt.NDArray[np.float64]
    """(ranks, packs) pack costs under ``SimConfig.layout``."""
    records_used: int
    records_left: int
    packs: Packs = ()
    """``packs[r][t]``: record ids of rank r's t-th micro-batch (a (ranks, packs, B) array for
    exactly-B strategies, lists of variable-size arrays otherwise), to run the real packs.
    Empty only for a schedule built from a cost matrix alone."""
    useful_costs: npt.NDArray[np.float64] | None = None
    """(ranks, packs) summed record costs of the same packs: the difference from
    ``pack_costs`` is the padding (``padded``). None: no padding."""
    step_sizes: npt.NDArray[np.int64] | None = None
    """Micro-batches per optimizer step where they vary (``nemo_mffd``, ``verl_dynbsz``,
    ``pooled_mffd_split``: one step per global batch); None: G each."""
    squared_lengths: npt.NDArray[np.float64] | None = None
    """(ranks, packs) sums of the records' squared lengths, for ``imbalance_sq``."""
    displacement: tuple[float, int] | None = None
    """(mean, max) steps records are emitted away from their stream window; None: not a
    node-stream strategy."""


def shard_table(
    tokens: npt.NDArray[np.integer], costs: npt.NDArray[np.float64], shard_records: int
) -> ShardTable:
    """The write-order record array cut into shards of ``shard_records`` (the last one shorter)."""
    n = int(np.asarray(tokens).size)
    counts = [shard_records] * (n // shard_records) + (
        [n % shard_records] if n % shard_records else []
    )
    return ShardTable.build(counts, weight=shard_weights(counts, costs))


def locality(
    packs: Packs,
    table: ShardTable,
    ranks_per_node: int,
    window: int,
) -> tuple[float, int]:
    """(download amplification, shard working set) of a schedule; see the module docstring."""
    ends = np.cumsum(table.counts)
    n_nodes = len(packs) // ranks_per_node
    per_node: list[set[int]] = []
    working = 0
    for node in range(n_nodes):
        ranks = packs[node * ranks_per_node : (node + 1) * ranks_per_node]
        n_packs = max((len(r) for r in ranks), default=0)
        seen: set[int] = set()
        for k in range(0, n_packs, window):
            ids = [p for r in ranks for p in r[k : k + window]]
            if not ids:
                continue
            shards = np.unique(np.searchsorted(ends, np.concatenate(ids), side="right"))
            working = max(working, int(shards.size))
            seen.update(shards.tolist())
        per_node.append(seen)
    distinct = len(set().union(*per_node)) if per_node else 0
    amplification = sum(len(s) for s in per_node) / distinct if distinct else float("nan")
    return amplification, working


def schedules(
    tokens: npt.NDArray[np.integer],
    cost_model: CostModel,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
    table: ShardTable | None = None,
) -> dict[str, Schedule]:
    """Plan one epoch of ``tokens`` (record lengths, write order) under each strategy.
    ``table``: the shard table of these tokens and costs (:func:`shard_table`), when the caller
    already has it (it takes a pass over every record)."""
    tok = np.asarray(tokens, dtype=np.int64)
    if tok.ndim != 1 or tok.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tok.shape}")
    if np.any(tok < 0):
        raise ValueError(f"tokens must be >= 0; found {int(tok.min())}")
    costs = validate_costs(cost_model.cost(tok))
    table = shard_table(tok, costs, config.shard_records) if table is None else table
    return plan_schedules(tok, costs, table, config, strategies)


def plan_schedules(
    tokens: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    table: ShardTable,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
    draw: Draw | None = None,
    terms: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None,
) -> dict[str, Schedule]:
    """:func:`schedules` from per-record costs and the shard table, for records already costed
    (a mixture: each stream under its own model, ``draw`` its epoch's draw; the pooled peers
    then read a global shuffle of the draw). ``terms``: image-text data's (vision, language)
    per record, ``costs`` their sum: the BCL strategies then plan as the readers do under a
    two-term cost model (:func:`_reader_terms`)."""
    squares = np.square(tokens.astype(np.float64))
    layout = check_layout(config.layout)
    epoch = _SimEpoch(tokens, costs, squares, table, config, draw, layout, terms)
    out: dict[str, Schedule] = {}
    for name in strategies:
        if name == "sequential":
            out[name] = _sequential(epoch)
        elif name in PEERS:
            out[name] = _peer(epoch, name)
        elif name.startswith("bcl-") and config.contract == "tokens":
            out[name] = _bcl_tokens(epoch, name)
        elif name.startswith("bcl-"):
            out[name] = _bcl(epoch, name)
        else:
            raise ValueError(
                f"unknown strategy {name!r}{rename_hint(name)}; choose from {STRATEGIES}"
            )
    return out


@dataclass(frozen=True, slots=True)
class _SimEpoch:
    """What every strategy of one simulated epoch plans from, and the two steps they share
    (their node streams, their schedule's costs), so that each strategy is one function."""

    tokens: npt.NDArray[np.int64]
    costs: npt.NDArray[np.float64]
    squares: npt.NDArray[np.float64]
    """Squared lengths (the schedule's attention-like load)."""
    table: ShardTable
    config: SimConfig
    draw: Draw | None
    layout: str
    terms: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
    """Image-text data's (vision, language) per record (``costs`` is their sum), or None."""

    def schedule(
        self, packs: Packs, used: int, left: int, steps: npt.NDArray[np.int64] | None = None
    ) -> Schedule:
        """The packs' costs under the layout, packed, and of squared lengths."""
        return Schedule(
            ragged_pack_costs(packs, self.costs, self.layout),
            used,
            left,
            packs,
            ragged_pack_costs(packs, self.costs, "packed"),
            steps,
            ragged_pack_costs(packs, self.squares, "packed"),
        )

    def streams_for(self, planner: PlanConfig, balanced: bool) -> NodeStreams:
        """The node streams BCL (``balanced``) or ``sequential`` reads (``plan_epoch``'s)."""
        c = self.config
        return build_node_streams(
            self.costs,
            self.table,
            planner,
            seed=c.seed,
            epoch=c.epoch,
            tokens=self.tokens,
            draw=self.draw,
            balanced=balanced,
        )


def _sequential(e: _SimEpoch) -> Schedule:
    """The baseline: BCL's node streams with balancing off, B records at a time: the record
    contract's plain loader whatever the contract (module docstring)."""
    plain = plan_config(replace(e.config, contract="pack"), "rank")
    plan = plan_streams(e.streams_for(plain, False), e.costs, e.tokens)
    return e.schedule(plan.packs, plan.records_used, plan.records_left)


def _peer(e: _SimEpoch, name: str) -> Schedule:
    """A peer's bins from the pools a central driver reads from one global shuffle."""
    config, tok = e.config, e.tokens
    capacity = config.max_tokens or default_capacity(tok, config.pack_size)
    order = global_order(tok.size, config.seed, config.epoch, shuffle=config.shuffle)
    if e.draw is not None:
        order = order[e.draw(order)]
    pool = Pool(order, tok, config.ranks, pool_records(tok, config), config.grad_accum)
    bins, left = plan_pooled(name, pool, capacity)
    used = sum(b.size for rank_bins in bins for b in rank_bins)
    left_count = sum(v.size for v in left.values())
    steps = micro_batches_per_batch(bins[0], order, pool.batch_size) if PEERS[name].pooled else None
    return e.schedule(bins, used, left_count, steps)


def _bcl_tokens(e: _SimEpoch, name: str) -> Schedule:
    """BCL under the tokens contract: micro-batches of at most ``max_tokens`` tokens, planned
    by the planner's one entry for a whole epoch, as ``bcl-stream plan`` and the readers'
    streams (``build_token_streams``) take it; each physical micro-batch a canonical one where
    the config sets canonical ranks."""
    config = e.config
    planner = plan_config(config, name.removeprefix("bcl-"))
    on = _reader_terms(e, planner)
    whole = plan_epoch(
        on.costs, on.table, planner, seed=config.seed, epoch=config.epoch, tokens=e.tokens,
        draw=e.draw,
    )  # fmt: skip
    packs3 = _physical(e, planner, _refined(e, planner, whole.packs))
    ragged = [[row[row >= 0] for row in rank] for rank in packs3]
    return e.schedule(ragged, whole.records_used, whole.records_left)


def _reader_terms(e: _SimEpoch, planner: PlanConfig) -> _SimEpoch:
    """The epoch a BCL strategy plans on: under ``terms`` with two or more ranks per node,
    the language term and its shard table, as the readers plan image-text data under a
    two-term cost model (``epoch/terms.py``); else ``e`` itself."""
    if e.terms is None or planner.ranks_per_node < 2:
        return e
    language = e.terms[1]
    counts = e.table.counts
    table = ShardTable.build(counts, weight=shard_weights(counts, language))
    return replace(e, costs=language, table=table)


def _refined(
    e: _SimEpoch, planner: PlanConfig, packs: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """``packs`` (the whole epoch) after the readers' two-term refinement where
    :func:`_reader_terms` planned the language term (unchanged elsewhere)."""
    if e.terms is None or planner.ranks_per_node < 2:
        return packs
    budget = planner.max_tokens is not None
    window = planning_window(planner)
    return refine_packs(
        packs, e.terms[0], e.terms[1], planner.ranks_per_node,
        tokens=e.tokens if budget else None, max_tokens=planner.max_tokens,
        window=window, guard_windows=GUARD_WINDOWS, slack=planner.two_term_slack,
    )  # fmt: skip


def _physical(
    e: _SimEpoch, planner: PlanConfig, packs: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """``packs`` (a whole canonical plan) as the physical ranks run them where the config sets
    canonical ranks (unchanged elsewhere): both BCL contracts' strategies map their plan the
    same way, so the simulated steps are the ones the readers would run."""
    config = e.config
    if config.canonical_ranks is None:
        return packs
    return physical_packs(
        packs,
        e.costs,
        config.ranks,
        config.ranks_per_node,
        planner.ranks_per_node,
        planner.grad_accum,
    )


def _bcl(e: _SimEpoch, name: str) -> Schedule:
    """BCL under the pack or step contract, on canonical ranks where the config sets them;
    with how far each record moved from its stream position."""
    config = e.config
    planner = plan_config(config, name.removeprefix("bcl-"))
    on = _reader_terms(e, planner)
    streams = on.streams_for(planner, True)
    plan = plan_streams(streams, on.costs, e.tokens)
    planned = _refined(e, planner, plan.packs)
    packs: Packs = _physical(e, planner, planned)
    if config.contract == "step":
        group = streams.config.row_ranks
        packs = node_micro_batches(
            planned, e.costs, config.grad_accum, e.layout, group, e.tokens, config.max_tokens
        )
    return replace(
        e.schedule(packs, plan.records_used, plan.records_left),
        displacement=displacement_steps(plan.packs, streams),
    )


def pool_records(tokens: npt.NDArray[np.integer], config: SimConfig) -> int:
    """Records per rank and micro-batch of the pooled peers' global batches (R*B*G records):
    B, or under ``contract="tokens"`` the records a BCL step reads per micro-batch,
    round(T * fill / mean length) (``token_contract.token_geometry``, the fill of scope
    ``node``'s rows), so the peers' optimizer
    steps hold the tokens BCL's hold and the comparison is at the same step size and budget."""
    if config.contract != "tokens" or config.max_tokens is None:
        return config.pack_size
    mean = mean_fed_tokens(tokens, config.max_tokens)
    aim = fill(plan_config(config, "node"))  # a node's rows (scope world may widen them)
    return max(1, round(config.max_tokens * aim / max(mean, 1.0)))


def budget(tokens: npt.NDArray[np.integer], config: SimConfig) -> int:
    """The token budget the simulated setting packs to: ``max_tokens``, or the default
    capacity (:func:`default_capacity`)."""
    return config.max_tokens or default_capacity(tokens, config.pack_size)


def micro_batch_price(
    tokens: npt.NDArray[np.integer], costs: npt.NDArray[np.float64], config: SimConfig
) -> float:
    """The absolute cost ``micro_batch_overhead`` adds to every micro-batch: F times a
    full-budget micro-batch of mean-length records, budget / mean length records costing
    c(mean length) each (c read off the records' own (length, cost) pairs, interpolated)."""
    if config.micro_batch_overhead == 0:
        return 0.0
    tok = np.asarray(tokens, dtype=np.float64)
    mean = float(tok.mean())
    order = np.argsort(tok, kind="stable")
    at_mean = float(np.interp(mean, tok[order], np.asarray(costs, dtype=np.float64)[order]))
    return config.micro_batch_overhead * budget(tokens, config) / max(mean, 1.0) * at_mean


BUDGET_KEYS = ("micro_batch_tokens", "micro_batches_per_rank", "useful_cost")
"""The keys :func:`budget_figures` adds to a strategy's metrics in ``simulate --json``."""


def budget_figures(s: Schedule, tokens: npt.NDArray[np.integer]) -> dict[str, object]:
    """The token contract's figures of one schedule: ``micro_batch_tokens`` (``max``,
    ``mean`` over the micro-batches that hold records), ``micro_batches_per_rank`` (``min``,
    ``max`` over ranks of the micro-batches each runs; a rank with fewer waits, or runs an
    empty one where the system pads, at every index some rank runs: ``time`` counts those) and
    ``useful_cost`` (the records' own cost)."""
    tok = np.asarray(tokens, dtype=np.float64)
    per = ragged_pack_costs(s.packs, tok, "packed")
    held = per[per > 0]
    counts = [len(rank) for rank in s.packs]
    return {
        "micro_batch_tokens": {
            "max": int(held.max()) if held.size else 0,
            "mean": float(held.mean()) if held.size else 0.0,
        },
        "micro_batches_per_rank": {"min": min(counts, default=0), "max": max(counts, default=0)},
        "useful_cost": useful_cost(s),
    }


def plan_config(config: SimConfig, scope: str) -> PlanConfig:
    """The planner configuration a simulated BCL strategy uses: the SimConfig's knobs built
    with its layout (``PlanKnobs.build``; with the ``padded`` layout the planner partitions
    by length: ``PlanConfig.partition_algorithm``)."""
    if config.canonical_ranks is None:
        return config.build(
            world_size=config.ranks,
            ranks_per_node=config.ranks_per_node,
            grad_accum=config.grad_accum,
            scope=scope,
        )
    v = config.canonical_ranks
    return config.build(
        world_size=v,
        ranks_per_node=config.canonical_ranks_per_node or config.ranks_per_node,
        grad_accum=config.grad_accum * config.ranks // v,
        scope=scope,
    )


def simulate(
    tokens: npt.NDArray[np.integer],
    cost_model: CostModel,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
) -> dict[str, Metrics]:
    """Plan one epoch under each strategy and score it with the metrics of docs/metrics.md."""
    tok = np.asarray(tokens, dtype=np.int64)
    costs = cost_model.cost(tok)
    table = shard_table(tok, costs, config.shard_records)
    price = micro_batch_price(tok, costs, config)
    return score(schedules(tok, cost_model, config, strategies, table), config, table, price)


def score(
    planned: dict[str, Schedule],
    config: SimConfig,
    table: ShardTable | None = None,
    price: float = 0.0,
) -> dict[str, Metrics]:
    """the metrics of docs/metrics.md of schedules already planned (plus download amplification and
    shard working set when the shard table is given). ``price``: the micro-batch price of
    ``micro_batch_overhead`` (:func:`micro_batch_price`), added to ``overhead``."""
    out: dict[str, Metrics] = {}
    for name, s in planned.items():
        metrics = metrics_from_costs(
            s.pack_costs,
            s.records_used,
            s.records_left,
            overhead=config.overhead + price,
            microbatches_per_step=config.grad_accum,
            sync=config.sync,
            step_sizes=s.step_sizes,
            useful_costs=s.useful_costs,
        )
        if s.squared_lengths is not None:
            metrics = replace(metrics, imbalance_sq=imbalance_sq(s.squared_lengths))
        if s.displacement is not None:
            metrics = replace(
                metrics,
                displacement_steps_mean=s.displacement[0],
                displacement_steps_max=float(s.displacement[1]),
            )
        if table is not None:
            amplification, working = locality(s.packs, table, config.ranks_per_node, config.window)
            metrics = replace(
                metrics, download_amplification=amplification, shard_working_set=working
            )
        out[name] = metrics
    return out


def efficiencies(planned: dict[str, Schedule], config: SimConfig) -> dict[str, dict[str, float]]:
    """Each schedule's balance efficiency per micro-batch and per optimizer step, whatever
    ``config.sync`` scores the rest under (``simulate`` prints both, labelled):
    ``{name: {"efficiency_per_micro_batch", "efficiency_per_step"}}``."""
    out: dict[str, dict[str, float]] = {}
    for name, s in planned.items():
        out[name] = {
            f"efficiency_per_{key}": metrics_from_costs(
                s.pack_costs,
                s.records_used,
                s.records_left,
                overhead=config.overhead,
                microbatches_per_step=config.grad_accum,
                sync=sync,
                step_sizes=s.step_sizes,
            ).efficiency
            for key, sync in (("micro_batch", "microbatch"), ("step", "step"))
        }
    return out


def useful_cost(s: Schedule) -> float:
    """The records' own estimated cost in a schedule: what a speedup is per unit of (the pack
    costs less padding; the pack costs themselves for a schedule without ``useful_costs``)."""
    return float((s.pack_costs if s.useful_costs is None else s.useful_costs).sum())


def speedups(
    planned: dict[str, Schedule],
    config: SimConfig,
    peers: tuple[str, ...] = REAL_PEERS,
    price: float = 0.0,
) -> dict[str, dict[str, float]]:
    """strategy -> {peer: speedup over that peer} for each peer in ``planned``.

    Time per unit of useful cost, (T_peer / cost_peer) / (T_x / cost_x), cost = the records'
    own costs (padding excluded, :func:`useful_cost`), so a strategy that leaves a few more
    records unused, or computes more padding, gets no credit for it."""
    metrics = score(planned, config, price=price)

    def per_cost(name: str) -> float:
        total = useful_cost(planned[name])
        return metrics[name].time / total if total > 0 else float("nan")

    present = [p for p in peers if p in planned]
    return {name: {p: per_cost(p) / per_cost(name) for p in present} for name in planned}
