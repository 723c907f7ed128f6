"""Batch Cost Lookahead over a whole epoch: every rank's packs of exactly B records.

Scopes (docs/metrics.md): ``rank`` balances each rank's own window (the paper's BCL); ``node`` plans
one window jointly for the P ranks of a node; ``world`` plans each node's window the same way
and has the nodes agree on per-step targets (``step_fill.fill_steps_joint``), so world balance
needs no record to move between nodes: every node reads only its own shards in every scope
(``dealing.deal_shards``). Every rank computes the same plan without communication: the inputs
are the replicated cost index and (seed, epoch).

Pack count: every rank gets ``n_packs = min over nodes of len(node stream) // (P * B)``,
computable from the shard table alone, so ranks never disagree and collectives never hang.
Records not emitted come back in ``Plan.remainder`` keyed by reason.

This module builds whole-epoch arrays, which is what tools, tests and the simulator want.
Readers plan lazily with :func:`bcl_stream.planner.windows.plan_windows`, which this calls.

Order of packs inside a window (``pack_order``): ``desc`` (heaviest first) aligns the residual
imbalance of independent windows across ranks, so rank 0's slightly heavy pack runs beside
rank 1's slightly heavy pack; ``stream`` keeps partition order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.config import REASON_TAIL, REASON_TOO_LONG, Plan, PlanConfig
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.shard_table import Ids, KeepFilter, Sample, ShardTable
from bcl_stream.planner.windows import plan_windows

WINDOW_BATCH = 64
"""Windows planned per call in :func:`plan_epoch`: large enough to amortize numpy's per-call
overhead, small enough that memory stays O(window) rather than O(epoch)."""


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
    sample: Sample | None = None,
) -> NodeStreams:
    """The epoch's streams; the memory cap and exclusions recompute the table's usable counts
    and mean costs (one pass over the records, only when either is set); a mixture's
    ``sample`` gives its counts without a pass."""
    if config.max_tokens is not None and tokens is None:
        raise ValueError("tokens are required when max_tokens is set")
    if costs.shape[0] != table.n_records:
        raise ValueError(
            f"costs hold {costs.shape[0]} records but the shards hold {table.n_records}"
        )
    keep = KeepFilter(tokens, config.max_tokens, excluded, sample)
    return NodeStreams(keep.kept_table(table, costs), config, seed, epoch, keep, costs)


def plan_epoch(
    costs: npt.NDArray[np.floating],
    table: ShardTable,
    config: PlanConfig,
    *,
    seed: int = 0,
    epoch: int = 0,
    tokens: npt.NDArray[np.integer] | None = None,
    excluded: Ids | None = None,
    sample: Sample | None = None,
) -> Plan:
    """Plan one epoch. ``costs`` and ``tokens`` are indexed by global sample id (write order;
    memory-mapped arrays work); ``tokens`` is required when ``config.max_tokens`` is set;
    ``excluded`` ids are neither planned nor reported, nor are ids outside a mixture's
    ``sample``. Output: ``Plan.packs`` of shape (world_size, n_packs, pack_size) and the
    remainder by reason.
    """
    streams = build_node_streams(
        costs,
        table,
        config,
        seed=seed,
        epoch=epoch,
        tokens=tokens,
        excluded=excluded,
        sample=sample,
    )
    return plan_streams(streams, costs, tokens, excluded=excluded, sample=sample)


def plan_streams(
    streams: NodeStreams,
    costs: npt.NDArray[np.floating],
    tokens: npt.NDArray[np.integer] | None = None,
    *,
    excluded: Ids | None = None,
    sample: Sample | None = None,
) -> Plan:
    """The whole epoch's plan of ``streams`` (built by :func:`build_node_streams` from the same
    costs, tokens, exclusions and sample): every row's windows, then the remainder."""
    config = streams.config
    out = np.empty((config.world_size, streams.n_packs, config.pack_size), dtype=np.int64)
    rows = np.arange(streams.n_rows)
    carry = None
    for start in range(0, streams.n_windows, WINDOW_BATCH):
        stop = min(start + WINDOW_BATCH, streams.n_windows)
        batch = plan_windows(streams, costs, tokens, rows, start, stop, carry)
        out[:, batch.first_pack : batch.first_pack + batch.packs.shape[1]] = batch.packs
        carry = batch.carry
    remainder: dict[str, Ids] = {
        REASON_TAIL: np.concatenate(
            [streams.tail(n) for n in range(len(streams.nodes))] or [np.empty(0, np.int64)]
        )
    }
    if config.max_tokens is not None and tokens is not None:
        remainder[REASON_TOO_LONG] = too_long(tokens, config.max_tokens, excluded, sample)
    return Plan(out, remainder)


def too_long(
    tokens: npt.NDArray[np.integer],
    max_tokens: int,
    excluded: Ids | None = None,
    sample: Sample | None = None,
) -> Ids:
    """Ids of records longer than the memory cap (not counting ``excluded`` ones, nor ids
    outside a mixture's ``sample``)."""
    ids = np.flatnonzero(np.asarray(tokens[:]) > max_tokens).astype(np.int64)
    if excluded is not None and excluded.size:
        ids = ids[~np.isin(ids, excluded)]
    if sample is not None and sample.active:
        ids = ids[sample(ids)]
    return ids
