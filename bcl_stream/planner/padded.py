"""Pack cost by batch layout, and the partition that suits the padded layout.

Layouts (how a trainer feeds a pack of B records to the model):

- ``packed``: the records are concatenated into one row and attention runs per record
  (varlen kernels with ``cu_seqlens``, or a block-diagonal mask). A pack costs the sum of its
  records' costs, sum_i c(L_i): what ``partition.py`` balances.
- ``padded``: B rows, each padded to the pack's longest record. Every row computes max L
  tokens, so a pack costs B * c(max L). Every cost model is nondecreasing in L (a, b, k >= 0,
  ``bcl_stream.cost.CostModel``), so c(max L) = max_i c(L_i) and the padded cost follows from
  the record costs alone. The padding waste of a pack is B * max - sum (in cost or in tokens).

Why a second partition: balancing sums (``partition.lpt_rounds``) deals long and short
records into every pack, the right thing for ``packed`` and the worst thing for ``padded``,
where each pack pays B times its longest record. For ``padded``, the total padded cost of a
window, sum over its packs of B * max, is minimized by sorting the window's records and
cutting the sorted order into consecutive chunks of B (exchange argument: the pack holding the
window's longest record pays for it whatever else it holds, so it should hold the next B-1
longest; repeat on the rest). The chunks are nested (every record of chunk j is <= every
record of chunk j+1), so ordering packs by sum or by max gives the same order: the packs the
planner runs in the same step (it orders a window's packs heaviest first and deals them to
ranks step by step) hold records of neighbouring length, so their padded costs are close and
the waste is small at once. With scope ``world`` (and ``node`` within a node) a step is G
consecutive chunks; its time is B times its longest record however those G*B records are
split, so sorted chunks also minimize the window's sum of step times. Scope ``rank`` cannot
do better without knowing the other ranks' windows: rank r's t-th heaviest pack runs beside
the other ranks' t-th heaviest, which matches length quantiles across ranks.

Swap refinement and the step-aware fill balance sums and would undo the grouping; the
``padded`` algorithm is therefore never refined (``partition.partition`` skips it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.checks import window_shape

LAYOUTS = ("packed", "padded")
"""Batch layouts, the one definition (planner, collate, calibration, DataModule): ``packed``
(varlen, compute ~ the records' sum) or ``padded`` (B x the longest record)."""

Packs = npt.NDArray[np.int64] | Sequence[Sequence[npt.NDArray[np.int64]]]
"""``packs[r][t]``: record ids of rank r's t-th pack: a (ranks, packs, B) array, or lists of
arrays of any size (bins of a pooled packer)."""


def check_layout(layout: str) -> str:
    """``layout`` if known, else a ValueError that lists the choices."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def pack_cost(record_costs: npt.ArrayLike, layout: str) -> npt.NDArray[np.float64]:
    """Cost of packs whose records' costs lie on the last axis: (..., B) -> (...).

    ``packed``: the sum. ``padded``: B times the largest (0 for empty packs).
    """
    costs = np.asarray(record_costs, dtype=np.float64)
    if check_layout(layout) == "packed" or costs.shape[-1] == 0:
        return costs.sum(axis=-1)
    return costs.shape[-1] * costs.max(axis=-1)


def padding_waste(record_values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """What the padded layout computes beyond the records themselves: (..., B) -> (...).

    ``record_values`` are per-record costs (waste in cost units) or token counts (padding
    tokens): B * max - sum. Zero for a pack of equal records, never negative.
    """
    values = np.asarray(record_values, dtype=np.float64)
    return pack_cost(values, "padded") - values.sum(axis=-1)


def ragged_pack_costs(
    packs: Packs,
    values: npt.NDArray[np.float64],
    layout: str,
) -> npt.NDArray[np.float64]:
    """(ranks, max packs per rank) costs of packs of any size; 0 where a rank has fewer packs.

    ``packs[r][t]``: the record ids of rank r's t-th pack (a bin of ``pooled_mffd`` may hold
    any number); ``values`` indexed by record id. A (ranks, packs, B) array is scored in one
    vectorized call, unless padded with -1 (the tokens contract's micro-batches).
    """
    check_layout(layout)
    if isinstance(packs, np.ndarray) and packs.ndim == 3:
        if packs.size and int(packs.min()) < 0:  # the tokens contract pads with -1
            packs = [[row[row >= 0] for row in rank] for rank in packs]
        else:
            return pack_cost(values[packs], layout)
    steps = max((len(rank) for rank in packs), default=0)
    out = np.zeros((len(packs), steps), dtype=np.float64)
    for r, rank in enumerate(packs):
        for t, ids in enumerate(rank):
            out[r, t] = pack_cost(values[np.asarray(ids, dtype=np.int64)], layout)
    return out


def partition_padded(costs: npt.NDArray[np.float64], n_packs: int) -> npt.NDArray[np.int64]:
    """Sorted chunks of B: the window partition that minimizes total padded cost.

    ``costs`` (n_windows, n_packs*B); output (n_windows, n_packs, B), positions into each
    window's row (``partition.Assignment``), packs in ascending cost, records in each pack
    ascending. Ties keep stream order (stable sort), so the result is deterministic.
    """
    pack_size = window_shape(costs, n_packs)
    by_cost = np.argsort(costs, axis=1, kind="stable")
    return by_cost.reshape(costs.shape[0], n_packs, pack_size).astype(np.int64)
