"""Batch Cost Lookahead: every rank's packs of exactly B records, window by window.

Scopes (docs/glossary.md): ``rank`` balances each rank's own window (the paper's BCL); ``node``
plans one window jointly for the P ranks of a node; ``world`` plans rows of several nodes
where a node holds fewer than ``world_row`` ranks or little data (``PlanConfig.rows_for``):
the row's shards form one stream read by its nodes (amplification = the row's width, within
``max_amplification``), and rows agree with each other without communication through the
shard-group order and the heavy lane's aligned blocks (``heavy_lane.py``). A reader plans only
its own row. Scopes ``rank`` and ``node`` read only the node's own shards
(``dealing.deal_shards``). Every rank computes the same plan without communication: the inputs
are the replicated cost index and (seed, epoch).

Pack count: every rank gets ``n_packs = min over streams of len(stream) // (ranks * B)``,
computable from the shard table alone, so ranks never disagree and collectives never hang.
Records not emitted come back in ``Plan.remainder`` keyed by reason.

One path (:func:`iter_windows`): a reader walks its own row's windows a batch at a time, the
whole-epoch plan (:func:`plan_streams`, what tools, tests and the simulator want) walks every
row's, and the ``sequential`` baseline walks the same streams with balancing off
(``balanced=False``).

Order of packs inside a window (``pack_order``): ``desc`` (heaviest first) aligns the residual
imbalance of independent windows across ranks, so rank 0's slightly heavy pack runs beside
rank 1's slightly heavy pack; ``stream`` keeps partition order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG, Plan, PlanConfig
from bcl_stream.planner.contracts import contract
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.shard_table import Draw, Ids, KeepFilter, ShardTable
from bcl_stream.planner.token_contract import (
    REASON_OVER_BUDGET,
    TokenWalker,
    even_steps,
    plan_tokens,
    token_geometry,
)
from bcl_stream.planner.windows import WindowBatch, plan_windows

WINDOW_BATCH = 16
"""Windows planned per call of :func:`plan_windows` (:func:`iter_windows`): 16 windows of W*B
records per rank amortize numpy's per-call overhead (``tools/bench_plan_scale.py``) while a
reader's memory stays O(window), never O(epoch)."""


def validate_costs(costs: npt.NDArray[np.floating], name: str = "costs") -> npt.NDArray[np.float64]:
    """Costs as float64, refusing NaN, infinities and negative values with the first bad index."""
    arr = np.asarray(costs, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be finite and >= 0; {name}[{first}] = {arr[first]!r}")
    return arr


def build_node_streams(
    costs: npt.NDArray[np.floating],
    table: ShardTable,
    config: PlanConfig,
    *,
    seed: int,
    epoch: int,
    tokens: npt.NDArray[np.integer] | None = None,
    excluded: Ids | None = None,
    draw: Draw | None = None,
    balanced: bool = True,
) -> NodeStreams:
    """The epoch's streams; the memory cap and exclusions recompute the table's usable counts
    and mean costs (one pass over the records, only when either is set); a mixture's
    ``draw`` gives its counts without a pass. ``balanced=False``: the ``sequential``
    baseline's streams (:meth:`PlanConfig.unbalanced`): the same records are kept (records over
    the memory cap are left out), but packs follow stream order and no pack cap is enforced,
    as a plain loader cannot."""
    if config.max_tokens is not None and tokens is None:
        raise ValueError("tokens are required when max_tokens is set")
    _check_costs(costs, table)
    keep = KeepFilter(tokens, config.max_tokens, excluded, draw)
    return _streams(keep.kept_table(table, costs), config, keep, costs, seed, epoch, balanced)


def _check_costs(costs: npt.NDArray[np.floating], table: ShardTable) -> None:
    """Refuse a cost array that does not hold one cost per record of ``table``."""
    if costs.shape[0] != table.n_records:
        raise ValueError(
            f"costs hold {costs.shape[0]} records but the shards hold {table.n_records}"
        )


def _streams(
    kept: ShardTable,
    config: PlanConfig,
    keep: KeepFilter,
    costs: npt.NDArray[np.floating],
    seed: int,
    epoch: int,
    balanced: bool,
) -> NodeStreams:
    """The streams over ``kept`` (the table :meth:`KeepFilter.kept_table` gave), so a caller
    that builds them twice from the same filter pays its pass over the records once."""
    layout = config if balanced else config.unbalanced()
    return NodeStreams(kept, layout, seed, epoch, keep, costs)


def build_token_streams(
    costs: npt.NDArray[np.floating],
    table: ShardTable,
    config: PlanConfig,
    *,
    seed: int,
    epoch: int,
    tokens: npt.NDArray[np.integer],
    excluded: Ids | None = None,
    draw: Draw | None = None,
    balanced: bool = True,
) -> NodeStreams:
    """The node streams of a budget contract's epoch (readers, ``plan_epoch`` and the
    simulator build them here alone): the geometry from the budget (``token_geometry``), with
    the step's intake evened so the shortest stream divides into whole steps
    (``token_contract.even_steps``; the streams are built again when that moves it, since
    their order follows the intake)."""
    _check_costs(costs, table)
    geometry = token_geometry(config, tokens, table.counts.size)
    keep = KeepFilter(tokens, geometry.max_tokens, excluded, draw)
    kept = keep.kept_table(table, costs)  # one pass, whichever intake the streams end with
    streams = _streams(kept, geometry, keep, costs, seed, epoch, balanced)
    shortest = min(len(s) for s in streams.nodes)
    even = even_steps(geometry, shortest, streams.config.stream_ranks)
    return streams if even is geometry else _streams(kept, even, keep, costs, seed, epoch, balanced)


def plan_epoch(
    costs: npt.NDArray[np.floating],
    table: ShardTable,
    config: PlanConfig,
    *,
    seed: int = 0,
    epoch: int = 0,
    tokens: npt.NDArray[np.integer] | None = None,
    excluded: Ids | None = None,
    draw: Draw | None = None,
    balanced: bool = True,
) -> Plan:
    """Plan one epoch (``balanced=False``: the ``sequential`` baseline, see
    :func:`build_node_streams`). ``costs`` and ``tokens`` are indexed by global record id (write order;
    memory-mapped arrays work); ``tokens`` is required when ``config.max_tokens`` is set;
    ``excluded`` ids are neither planned nor reported, nor are ids outside a mixture's
    ``draw``. Output: ``Plan.packs`` of shape (world_size, n_packs, pack_size) and the
    remainder by reason. Under a budget contract (``tokens``) the micro-batches are planned by
    its own geometry and walker, padded with ``token_contract.EMPTY`` to the widest one (shape
    (world_size, n_micro_batches, widest)), and the remainder adds ``over_token_budget``.
    """
    if contract(config.contract).budget:
        return _plan_budget_epoch(costs, table, config, seed, epoch, tokens, excluded, draw)
    streams = build_node_streams(
        costs,
        table,
        config,
        seed=seed,
        epoch=epoch,
        tokens=tokens,
        excluded=excluded,
        draw=draw,
        balanced=balanced,
    )
    return plan_streams(streams, costs, tokens)


def _plan_budget_epoch(
    costs: npt.NDArray[np.floating],
    table: ShardTable,
    config: PlanConfig,
    seed: int,
    epoch: int,
    tokens: npt.NDArray[np.integer] | None,
    excluded: Ids | None,
    draw: Draw | None,
) -> Plan:
    """:func:`plan_epoch` under a budget contract: the reader's geometry (records per window
    from the budget), its walker over every row, and the remainder by reason."""
    if tokens is None:
        raise ValueError(f"contract {config.contract!r} needs the records' tokens")
    streams = build_token_streams(
        costs, table, config, seed=seed, epoch=epoch, tokens=tokens, excluded=excluded, draw=draw
    )
    packs, dropped = plan_tokens(TokenWalker(streams, costs, tokens, config))
    tails = [streams.tail(n) for n in range(len(streams.nodes))]
    remainder = {REASON_TAIL: np.concatenate(tails), REASON_OVER_BUDGET: dropped}
    if streams.keep is not None:
        remainder[REASON_TOO_LONG] = streams.keep.too_long()
    return Plan(packs, remainder)


def iter_windows(
    streams: NodeStreams,
    costs: npt.NDArray[np.floating],
    tokens: npt.NDArray[np.integer] | None,
    rows: npt.ArrayLike,
    first: int = 0,
    stop: int | None = None,
) -> Iterator[WindowBatch]:
    """The one path every plan takes: ``rows``' windows ``first`` .. ``stop`` (default: the
    epoch's end), :data:`WINDOW_BATCH` windows per :func:`plan_windows` call, each batch
    continuing from the previous one's carry. A reader passes its own row, the whole-epoch
    plan every row; both therefore emit the same packs (``plan_windows`` replays the carry
    when ``first`` falls inside a carry span)."""
    end = streams.n_windows if stop is None else min(stop, streams.n_windows)
    carry = None
    for lo in range(first, end, WINDOW_BATCH):
        batch = plan_windows(streams, costs, tokens, rows, lo, min(lo + WINDOW_BATCH, end), carry)
        carry = batch.carry
        yield batch


def plan_streams(
    streams: NodeStreams,
    costs: npt.NDArray[np.floating],
    tokens: npt.NDArray[np.integer] | None = None,
) -> Plan:
    """The whole epoch's plan of ``streams`` (built by :func:`build_node_streams` from the same
    costs and tokens): every row's windows, then the remainder (each node's tail, and the
    records over the memory cap the streams' filter left out)."""
    config = streams.config
    out = np.empty((config.world_size, streams.n_packs, config.pack_size), dtype=np.int64)
    for batch in iter_windows(streams, costs, tokens, np.arange(streams.n_rows)):
        out[:, batch.first_pack : batch.first_pack + batch.packs.shape[1]] = batch.packs
    remainder: dict[str, Ids] = {
        REASON_TAIL: np.concatenate(
            [streams.tail(n) for n in range(len(streams.nodes))] or [np.empty(0, np.int64)]
        )
    }
    if streams.keep is not None and streams.keep.max_tokens is not None:
        remainder[REASON_TOO_LONG] = streams.keep.too_long()
    return Plan(out, remainder)
