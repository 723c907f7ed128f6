"""Plan a range of windows for some planning rows: O(window) memory, resumable carry state.

A reader plans only its own row's windows (its rank in scope ``rank``, its node in scopes
``node`` and ``world``), a batch of windows at a time, so a process pays for its own node
whatever the cluster's size; the
whole-epoch plan (:func:`bcl_stream.planner.bcl.plan_epoch`) is the same function run over every
window, so a windowed plan equals the whole-epoch plan by construction (tests check it).

Carry-over makes window k depend on what window k-1 held back: :class:`WindowBatch` returns that
carry (record ids, ``carry`` records per rank) so the next batch, or a resumed reader, continues
from it. Windows come in runs of identical shape (:func:`carry_runs`) so a run is planned in
one vectorized call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import PlanError
from bcl_stream.planner import checks
from bcl_stream.planner.carry import hold_back
from bcl_stream.planner.config import PlanConfig
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.partition import UNREFINED, partition
from bcl_stream.planner.shard_table import Ids
from bcl_stream.planner.step_fill import fill_steps

Costs = npt.NDArray[np.floating]


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive windows of one shape: each emits ``per_rank`` packs per rank, reads ``fresh``
    new records per row and holds back ``hold``; the first reads from row position ``read_from``
    and starts with a carry-in of ``carry_in`` records. ``drain_to`` > 0 marks the window before
    the last of a carry span: the last window reads fresh records up to row position
    ``drain_to`` and emits ``drain_packs`` packs per rank."""

    first_window: int
    n_windows: int
    per_rank: int
    read_from: int
    carry_in: int
    hold: int
    drain_to: int = 0
    drain_packs: int = 0

    def fresh(self, config: PlanConfig) -> int:
        return self.per_rank * config.row_ranks * config.pack_size - self.carry_in + self.hold

    def read_start(self, window: int, config: PlanConfig) -> int:
        """Row position of the first record that window ``window`` (of this run or the one
        after it) reads fresh."""
        return self.read_from + (window - self.first_window) * self.fresh(config)


@functools.lru_cache(maxsize=16)
def carry_runs(n_packs: int, config: PlanConfig) -> tuple[Run, ...]:
    """The epoch's windows grouped into runs (O(windows), no data touched).

    Window k emits its carry-in plus new records; it reads up to ``carry * group`` records beyond
    what it emits and holds back the excess. The carry chain restarts every ``carry_span``
    windows: the held records drain into the span's last window, and the window before it
    steers its hold-back with that last window's records in view
    (:func:`~bcl_stream.planner.carry.hold_back`, ``then``). So the carry at any window follows
    from at most ``carry_span - 1`` hold-backs (a resumed reader replays them; no carry state in
    the cursor). Cached: a reader plans batch after batch of the same epoch.
    """
    group, size, window = config.row_ranks, config.pack_size, config.window
    lookahead = config.carry_records * group
    n_windows = -(-n_packs // window)
    span = config.carry_span or max(n_windows, 1)
    runs: list[Run] = []
    for s0 in range(0, n_windows, span):
        s1 = min(s0 + span, n_windows)
        end = min(s1 * window, n_packs) * group * size
        emitted = read = s0 * window * group * size
        carried = 0
        for k in range(s0, s1):
            per_rank = min(window, n_packs - k * window)
            count = per_rank * group * size
            read_to = min(emitted + count + lookahead, end)
            hold = read_to - (emitted + count)
            drain = k == s1 - 2 and hold > 0
            last = runs[-1] if runs else None
            if (
                last is not None
                and not drain
                and k < s1 - 2
                and last.first_window >= s0
                and last.carry_in == last.hold == carried == hold
                and last.per_rank == per_rank
            ):
                runs[-1] = Run(last.first_window, last.n_windows + 1, per_rank, last.read_from,
                               carried, hold)  # fmt: skip
            else:
                drain_packs = min(window, n_packs - (k + 1) * window) if drain else 0
                runs.append(
                    Run(k, 1, per_rank, read, carried, hold, end if drain else 0, drain_packs)
                )
            emitted, read, carried = emitted + count, read_to, hold
    return tuple(runs)


@dataclass(frozen=True, slots=True)
class WindowBatch:
    """Packs of a range of windows for some rows, and the carry to continue with."""

    packs: Ids
    """(rows * row_ranks, packs in the range, pack_size): ranks of the rows in order."""
    carry: Ids
    """(rows, held records): what the last window held back for the next one."""
    first_pack: int
    """Index of the first pack of the range in the epoch."""


def _gather_costs(costs: Costs, ids: Ids) -> npt.NDArray[np.float64]:
    out = np.asarray(costs[ids], dtype=np.float64)
    bad = ~np.isfinite(out) | (out < 0)
    if bad.any():
        first = ids[bad][0]
        raise ValueError(f"costs must be finite and >= 0; costs[{first}] = {costs[first]!r}")
    return out


def _repair_token_cap(packs: Ids, tokens: npt.NDArray[np.integer], max_tokens: int) -> None:
    """Swap records in place until every pack of every window holds <= max_tokens tokens."""
    pack_tokens = np.asarray(tokens[packs], dtype=np.int64).sum(axis=2)
    for w in np.flatnonzero((pack_tokens > max_tokens).any(axis=1)):
        window = packs[w]
        tok = np.asarray(tokens[window], dtype=np.int64)
        for _ in range(window.size):
            load = tok.sum(axis=1)
            over, roomy = int(load.argmax()), int(load.argmin())
            if load[over] <= max_tokens:
                break
            i, j = int(tok[over].argmax()), int(tok[roomy].argmin())
            gain = int(tok[over, i]) - int(tok[roomy, j])
            if gain <= 0 or load[roomy] + gain > max_tokens:
                break
            window[over, i], window[roomy, j] = window[roomy, j], window[over, i]
            tok[over, i], tok[roomy, j] = tok[roomy, j], tok[over, i]
        if tok.sum(axis=1).max() > max_tokens:
            raise PlanError(
                f"cannot fit {window.shape[1]} records per pack under max_tokens={max_tokens}: a "
                f"window's packs need at least {int(tok.sum(axis=1).max())} tokens in one pack. "
                "Lower pack_size, raise max_tokens, or cap record length at preprocessing "
                "(--max-record-tokens)."
            )


def partition_windows(
    windows: Ids,
    costs: Costs,
    tokens: npt.NDArray[np.integer] | None,
    per_rank: int,
    config: PlanConfig,
) -> tuple[Ids, npt.NDArray[np.float64]]:
    """Partition (rows, n, count) windows into packs, heaviest first. Output: packs
    (rows, n, per_rank*G, B) and their loads (rows, n, per_rank*G)."""
    rows, n, count = windows.shape
    m, size = per_rank * config.row_ranks, config.pack_size
    flat_ids = windows.reshape(rows * n, count)
    window_costs = _gather_costs(costs, flat_ids)
    algorithm = config.partition_algorithm
    assign = partition(window_costs, m, algorithm, config.refine)
    if config.step_fill and config.pack_order == "desc" and algorithm not in UNREFINED:
        assign = fill_steps(window_costs, assign, config.row_ranks, config.refine)
    flat = assign.reshape(rows * n, -1)
    packs = np.take_along_axis(flat_ids, flat, axis=1).reshape(rows * n, m, size)
    if config.max_tokens is not None and tokens is not None:
        _repair_token_cap(packs, tokens, config.max_tokens)
        loads = _gather_costs(costs, packs).sum(axis=2)
    else:
        loads = np.take_along_axis(window_costs, flat, axis=1).reshape(packs.shape).sum(axis=2)
    if config.pack_order == "desc":
        by_load = np.argsort(-loads, axis=1, kind="stable")
        packs = np.take_along_axis(packs, by_load[:, :, None], axis=1)
        loads = np.take_along_axis(loads, by_load, axis=1)
    return packs.reshape(rows, n, m, size), loads.reshape(rows, n, m)


def rank_order(
    loads: npt.NDArray[np.float64], first_pack: int, config: PlanConfig
) -> npt.NDArray[np.int64]:
    """Which of a step's G packs each rank of a row runs: (rows, n, per_rank, G) indices.

    Packs of a step are sorted heaviest first. With ``grad_accum`` A > 1 the heaviest pack of
    each micro-step goes to the rank with the least work so far in the optimizer step (steps
    start at global micro-step indices that are multiples of A), so per-step sums of the ranks
    even out as well; otherwise rank j runs the j-th heaviest.
    """
    rows, n, m = loads.shape
    group = config.row_ranks
    per_rank = m // group
    ident = np.broadcast_to(np.arange(group), (rows, n, per_rank, group))
    if config.grad_accum <= 1 or group == 1:
        return ident.copy()
    step_loads = loads.reshape(rows, n, per_rank, group)
    out = np.empty((rows, n, per_rank, group), dtype=np.int64)
    acc = np.zeros((rows, n, group))
    window_start = first_pack + np.arange(n) * per_rank
    for t in range(per_rank):
        reset = (window_start + t) % config.grad_accum == 0
        acc[:, reset] = 0.0
        lightest = np.argsort(acc, axis=2, kind="stable")  # rank receiving the i-th heaviest
        np.put_along_axis(out[:, :, t], lightest, np.arange(group)[None, None, :], axis=2)
        acc += np.take_along_axis(step_loads[:, :, t], out[:, :, t], axis=2)
    return out


def plan_windows(
    streams: NodeStreams,
    costs: Costs,
    tokens: npt.NDArray[np.integer] | None,
    rows: npt.ArrayLike,
    start: int = 0,
    stop: int | None = None,
    carry: Ids | None = None,
) -> WindowBatch:
    """Windows ``[start, stop)`` of ``rows``. ``carry``: what window ``start - 1`` held back, as
    returned by the batch before; None replays it (at most ``carry_span - 1`` hold-backs, no
    partitioning). A carry is checked for shape, range, duplicates and for holding only records
    window ``start - 1`` read fresh; one that passes but is not the carry the plan produced gives
    another plan, so pass the previous call's carry or None. Rows are planned independently:
    any subset of rows gives the same packs as planning every row."""
    planned = _Rows.checked(streams, costs, tokens, rows)
    config, n_windows = streams.config, streams.n_windows
    start = checks.integer(start, "start window", 0, n_windows)
    stop = n_windows if stop is None else checks.integer(stop, "stop window", start, n_windows)
    runs = carry_runs(streams.n_packs, config)
    if carry is None and config.carry_records == 0:  # no carry: nothing to replay
        carried = planned.no_carry()
    elif carry is None:
        span = config.carry_span or max(n_windows, 1)
        carried = _walk(planned, runs, start - start % span, start, None, None)
    else:
        carried = _check_carry(planned, runs, start, carry)
    window = config.window
    first_pack = start * window
    end_pack = min(stop * window, streams.n_packs)
    out = np.empty(
        (planned.ids.size * config.row_ranks, end_pack - first_pack, config.pack_size), np.int64
    )
    carried = _walk(planned, runs, start, stop, carried, out)
    return WindowBatch(out, carried, first_pack)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The planning rows of one :func:`plan_windows` call and the per-record arrays it reads,
    checked once at the boundary: what every step of the call works on."""

    streams: NodeStreams
    costs: Costs
    tokens: npt.NDArray[np.integer] | None
    ids: Ids
    """Row ids, in the order their ranks appear in the output."""

    @classmethod
    def checked(
        cls,
        streams: NodeStreams,
        costs: Costs,
        tokens: npt.NDArray[np.integer] | None,
        rows: npt.ArrayLike,
    ) -> _Rows:
        """The call's rows, or a ValueError naming the argument that does not fit ``streams``."""
        checks.per_record(costs, "costs", streams.n_records)
        if tokens is not None:
            checks.per_record(tokens, "tokens", streams.n_records)
        ids = checks.array(rows, "rows", whole=True)
        if ids.size == 0 or np.any((ids < 0) | (ids >= streams.n_rows)):
            raise ValueError(
                f"rows must be one or more row ids in [0, {streams.n_rows}), got {rows!r}"
            )
        return cls(streams, costs, tokens, ids)

    def no_carry(self) -> Ids:
        """An empty carry: what a carry span starts from."""
        return np.empty((self.ids.size, 0), np.int64)

    def fresh(self, run: Run, first: int, n: int) -> Ids:
        """(rows, n, fresh) records that windows ``first`` .. ``first + n - 1`` of ``run`` read
        fresh, each row from its own stream."""
        config = self.streams.config
        read_from = run.read_start(first, config)
        stop = run.read_start(first + n, config)
        return self.streams.fetch(self.ids, read_from, stop).reshape(
            self.ids.size, n, run.fresh(config)
        )


def _walk(
    rows: _Rows,
    runs: tuple[Run, ...],
    start: int,
    stop: int,
    carry: Ids | None,
    out: Ids | None,
) -> Ids:
    """Hold back (and, with ``out``, partition and place) windows ``[start, stop)``; returns
    the carry after ``stop - 1``. ``carry`` None: ``start`` begins a carry span."""
    streams, costs = rows.streams, rows.costs
    config = streams.config
    group, size, window = config.row_ranks, config.pack_size, config.window
    carried = rows.no_carry() if carry is None else carry
    mean = streams.table.mean_cost
    for run in runs:
        lo, hi = max(run.first_window, start), min(run.first_window + run.n_windows, stop)
        if lo >= hi:
            continue
        width = run.carry_in if lo == run.first_window else run.hold
        if carried.shape[1] != width:
            raise ValueError(
                f"window {lo} needs a carry of {width} records per row, got {carried.shape[1]}"
            )
        new = rows.fresh(run, lo, hi - lo)
        target = mean * run.per_rank * group * size
        then, then_target = None, None
        if run.drain_to:  # the next window drains the carry: keep it in view
            last = streams.fetch(rows.ids, run.read_start(lo + 1, config), run.drain_to)
            then = _gather_costs(costs, last).sum(axis=1)
            then_target = mean * run.drain_packs * group * size
        windows, carried = hold_back(
            new, carried, costs, run.hold, target, then=then, then_target=then_target
        )
        if out is not None:
            packs, loads = partition_windows(windows, costs, rows.tokens, run.per_rank, config)
            _place(packs, loads, (lo - start) * window, lo * window, config, out)
    return carried


def _check_carry(rows: _Rows, runs: tuple[Run, ...], start: int, carry: object) -> Ids:
    """``carry`` as (rows, held) ids if it is what window ``start - 1`` held back, else a
    ValueError naming it.

    A window holds back only records it read fresh (``hold_back``), so a genuine carry is a
    duplicate-free subset of the previous window's fresh records of the same row: that is
    checked exactly (one window of ids per row). Its width is checked against the run.
    """
    n_records = rows.streams.n_records
    arr = np.asarray(carry)
    if arr.dtype.kind not in "iu" or arr.ndim != 2:
        raise ValueError(
            f"carry must be an integer array of shape (rows, held records), got "
            f"{arr.dtype} {arr.shape}: pass the WindowBatch.carry of the previous call"
        )
    if arr.shape[0] != rows.ids.size:
        raise ValueError(f"carry has {arr.shape[0]} rows but {rows.ids.size} rows are planned")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n_records):
        raise ValueError(f"carry holds ids outside [0, {n_records}): not a carry of this plan")
    ids = arr.astype(np.int64)
    if ids.shape[1] == 0 or start == 0:
        return ids
    k = start - 1
    run = next(r for r in runs if r.first_window <= k < r.first_window + r.n_windows)
    previous = rows.fresh(run, k, 1)[:, 0]
    for i, row in enumerate(rows.ids):
        held = ids[i]
        if np.unique(held).size != held.size or not np.isin(held, previous[i]).all():
            raise ValueError(
                f"carry of row {int(row)} holds records not held back by window {k} (duplicates "
                "or ids of other windows): it is not the carry this plan produced. Pass the "
                "WindowBatch.carry of the call that planned window "
                f"{k}, or re-plan from window 0"
            )
    return ids


def _place(
    packs: Ids,
    loads: npt.NDArray[np.float64],
    offset: int,
    first_pack: int,
    config: PlanConfig,
    out: Ids,
) -> None:
    """Write (rows, n, per_rank*G, B) packs into ``out`` (rows*G ranks, packs, B) at ``offset``.

    Step t of a window takes packs t*G .. t*G+G-1 (similar cost), one per rank of the row.
    """
    rows, n, m, size = packs.shape
    group = config.row_ranks
    per_rank = m // group
    who = rank_order(loads, first_pack, config)  # (rows, n, per_rank, G)
    grid = packs.reshape(rows, n, per_rank, group, size)
    grid = np.take_along_axis(grid, who[..., None], axis=3)
    by_rank = grid.transpose(0, 3, 1, 2, 4).reshape(rows * group, n * per_rank, size)
    out[:, offset : offset + n * per_rank] = by_rank
