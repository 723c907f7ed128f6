"""Batch Cost Lookahead: the epoch's stream order -> exactly-B-record packs for every rank.

Scopes (DESIGN.md): ``rank`` balances each rank's own window (the paper's BCL; a rank reads
only its contiguous share of the stream); ``node`` plans one window jointly for the ranks of a
node; ``world`` for all ranks. Every rank computes the same plan without communication: the
inputs are the replicated cost index and (seed, epoch).

Pack count: every rank gets ``n_packs = min over groups of len(group stream) // (B * G)``
packs (G = ranks per planning group), computable from the index alone, so ranks never
disagree and collectives never hang. Records not emitted come back in ``Plan.remainder``
keyed by reason.

Order of packs inside a window (``pack_order``): ``desc`` (heaviest first) aligns the residual
imbalance of independent windows across ranks, so rank 0's slightly heavy pack runs beside
rank 1's slightly heavy pack; ``stream`` keeps partition order; tools/bench_balance.py measures
the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import PlanError
from bcl_stream.planner.carry import hold_back
from bcl_stream.planner.partition import ALGORITHMS, partition
from bcl_stream.planner.step_fill import fill_steps

SCOPES = ("rank", "node", "world")
PACK_ORDERS = ("desc", "stream")
REASON_TOO_LONG = "longer_than_max_tokens"
REASON_TAIL = "epoch_tail"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """Everything besides data and (seed, epoch) that decides a plan."""

    world_size: int
    """Number of data-parallel ranks R."""
    pack_size: int
    """Records per pack B: the trainer's record-count contract."""
    window: int
    """Packs per rank planned together W: a rank buffers W*B records (times G for wider scopes)."""
    ranks_per_node: int = 1
    """Ranks per node; must divide ``world_size``."""
    scope: str = "rank"
    """``rank`` | ``node`` | ``world``: which ranks are balanced jointly."""
    max_tokens: int | None = None
    """Memory cap M: max tokens per pack. Records longer than M go to the remainder."""
    algorithm: str = "lpt"
    """Partition algorithm (``bcl_stream.planner.partition.ALGORITHMS``)."""
    refine: int = 8
    """Swap-refinement iterations after the partition (0 disables)."""
    pack_order: str = "desc"
    """Order of the packs inside a window: ``desc`` or ``stream``."""
    step_fill: bool = True
    """Scopes node/world: give the step-mates of an unbalanceable heavy pack more work
    (``planner/step_fill.py``). Needs ``pack_order="desc"``."""
    carry: int | None = None
    """Records per rank read beyond the window and possibly held back one window to steer the
    window's total cost to the epoch mean (``planner/carry.py``). None: W*B/4; 0 disables.
    Buffer per rank = W*B + carry records."""

    def __post_init__(self) -> None:
        for name in ("world_size", "pack_size", "window", "ranks_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} does not divide world_size={self.world_size}"
            )
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"algorithm must be one of {sorted(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if self.refine < 0:
            raise ValueError(f"refine must be >= 0, got {self.refine}")
        if self.pack_order not in PACK_ORDERS:
            raise ValueError(f"pack_order must be one of {PACK_ORDERS}, got {self.pack_order!r}")
        if self.carry is not None and not 0 <= self.carry < self.window * self.pack_size:
            raise ValueError(
                f"carry must be in [0, window*pack_size={self.window * self.pack_size}), got {self.carry!r}"
            )

    @property
    def carry_records(self) -> int:
        """Records per rank of lookahead actually used (resolves the None default)."""
        return self.window * self.pack_size // 4 if self.carry is None else self.carry

    @property
    def group_size(self) -> int:
        """Ranks planned jointly: 1, ranks_per_node or world_size."""
        return {"rank": 1, "node": self.ranks_per_node, "world": self.world_size}[self.scope]


@dataclass(frozen=True, slots=True)
class Plan:
    """One epoch's packs for every rank, plus what was left out and why."""

    packs: npt.NDArray[np.int64]
    """(world_size, n_packs, pack_size) global sample ids."""
    remainder: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    """Sample ids not emitted this epoch, keyed by reason."""

    @property
    def n_packs(self) -> int:
        """Packs per rank (identical on every rank)."""
        return int(self.packs.shape[1])

    @property
    def records_used(self) -> int:
        return int(self.packs.size)

    @property
    def records_left(self) -> int:
        return int(sum(ids.size for ids in self.remainder.values()))

    def remainder_counts(self) -> dict[str, int]:
        """Reason -> count, for reports."""
        return {reason: int(ids.size) for reason, ids in self.remainder.items() if ids.size}


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


def _split_groups(
    order: npt.NDArray[np.int64], n_groups: int, per_group: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Contiguous chunks of the stream, each truncated to ``per_group``; the rest is the tail."""
    chunks = np.array_split(order, n_groups)
    used = np.stack([chunk[:per_group] for chunk in chunks])
    tail = np.concatenate([chunk[per_group:] for chunk in chunks])
    return used, tail


def _repair_token_cap(
    packs: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64], max_tokens: int
) -> None:
    """Swap records in place until every pack of every window holds <= max_tokens tokens."""
    pack_tokens = tokens[packs].sum(axis=2)
    for w in np.flatnonzero((pack_tokens > max_tokens).any(axis=1)):
        window = packs[w]
        for _ in range(window.size):
            load = tokens[window].sum(axis=1)
            over = int(load.argmax())
            if load[over] <= max_tokens:
                break
            roomy = int(load.argmin())
            i = int(tokens[window[over]].argmax())
            j = int(tokens[window[roomy]].argmin())
            gain = int(tokens[window[over, i]]) - int(tokens[window[roomy, j]])
            if gain <= 0 or load[roomy] + gain > max_tokens:
                break
            window[over, i], window[roomy, j] = window[roomy, j], window[over, i]
        load = tokens[window].sum(axis=1)
        if load.max() > max_tokens:
            raise PlanError(
                f"cannot fit {window.shape[1]} records per pack under max_tokens={max_tokens}: a "
                f"window's packs need at least {int(load.max())} tokens in one pack. Lower "
                "pack_size, raise max_tokens, or cap record length at preprocessing "
                "(--max-record-tokens)."
            )


def _plan_windows(
    streams: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    tokens: npt.NDArray[np.int64] | None,
    packs_per_rank: int,
    config: PlanConfig,
) -> npt.NDArray[np.int64]:
    """Partition same-sized windows of every group at once. Output (groups, windows, G*p, B)."""
    n_groups = streams.shape[0]
    group, size = config.group_size, config.pack_size
    per_window = packs_per_rank * group * size
    windows = streams.reshape(-1, per_window)
    window_costs = costs[windows]
    assign = partition(window_costs, packs_per_rank * group, config.algorithm, config.refine)
    if config.step_fill and config.pack_order == "desc":
        assign = fill_steps(window_costs, assign, group, config.refine)
    flat = assign.reshape(windows.shape[0], -1)
    packs = np.take_along_axis(windows, flat, axis=1)
    packs = packs.reshape(windows.shape[0], packs_per_rank * group, size)
    repaired = config.max_tokens is not None and tokens is not None
    if repaired:
        _repair_token_cap(packs, tokens, config.max_tokens)  # type: ignore[arg-type]
    if config.pack_order == "desc":
        if repaired:  # the repair may have moved records: loads from the ids
            load = costs[packs].sum(axis=2)
        else:
            load = np.take_along_axis(window_costs, flat, axis=1).reshape(packs.shape).sum(axis=2)
        by_load = np.argsort(-load, axis=1, kind="stable")
        packs = np.take_along_axis(packs, by_load[:, :, None], axis=1)
    return packs.reshape(n_groups, -1, packs_per_rank * group, size)


def _place(
    planned: npt.NDArray[np.int64], config: PlanConfig, first_pack: int, out: npt.NDArray[np.int64]
) -> None:
    """Write (groups, windows, G*p, B) sorted packs into ``out`` (ranks, packs, B).

    Step t of a window takes packs t*G .. t*G+G-1, one per rank of the group, so packs of
    similar cost run in the same step.
    """
    n_groups, n_windows, group_packs, size = planned.shape
    group = config.group_size
    per_rank = group_packs // group
    grid = planned.reshape(n_groups, n_windows, per_rank, group, size)
    by_rank = grid.transpose(0, 3, 1, 2, 4).reshape(config.world_size, -1, size)
    out[:, first_pack : first_pack + n_windows * per_rank] = by_rank


def _plan_batched(
    streams: npt.NDArray[np.int64],
    cost: npt.NDArray[np.float64],
    tok: npt.NDArray[np.int64] | None,
    n_packs: int,
    config: PlanConfig,
    out: npt.NDArray[np.int64],
) -> None:
    """No carry: windows are independent, so all full windows are planned in one call."""
    group, size, window = config.group_size, config.pack_size, config.window
    n_full, last = divmod(n_packs, window)
    spans = [(0, n_full, window)] if n_full else []
    if last:
        spans.append((n_full * window, 1, last))
    for first_pack, n_windows, per_rank in spans:
        start = first_pack * group * size
        chunk = streams[:, start : start + n_windows * per_rank * group * size]
        _place(_plan_windows(chunk, cost, tok, per_rank, config), config, first_pack, out)


def _carry_runs(
    n_packs: int, total: int, config: PlanConfig
) -> list[tuple[int, int, int, int, int]]:
    """Windows grouped into runs of identical shape: (first_pack, n_windows, per_rank, read_from, hold).

    Window k emits ``count`` records: its carry-in plus new records; it reads up to
    ``lookahead`` records beyond what it emits and holds back the excess (drains at the end).
    Windows join a run only when their carry-in, fresh reads and hold all match the run's.
    """
    group, size = config.group_size, config.pack_size
    lookahead = config.carry_records * group
    runs: list[tuple[int, int, int, int, int]] = []
    steady: list[bool] = []  # the run's windows each carry in exactly what they hold back
    emitted = read = carried = 0
    for first_pack in range(0, n_packs, config.window):
        per_rank = min(config.window, n_packs - first_pack)
        count = per_rank * group * size
        read_to = min(emitted + count + lookahead, total)
        hold = read_to - (emitted + count)
        is_steady = carried == hold
        if runs and steady[-1] and is_steady and runs[-1][2] == per_rank and runs[-1][4] == hold:
            p0, n, pr, r0, h = runs[-1]
            runs[-1] = (p0, n + 1, pr, r0, h)
        else:
            runs.append((first_pack, 1, per_rank, read, hold))
            steady.append(is_steady)
        emitted, read, carried = emitted + count, read_to, hold
    return runs


def _plan_with_carry(
    streams: npt.NDArray[np.int64],
    cost: npt.NDArray[np.float64],
    tok: npt.NDArray[np.int64] | None,
    n_packs: int,
    config: PlanConfig,
    target_mean: float,
    out: npt.NDArray[np.int64],
) -> None:
    """Carry-over windows, batched over groups and over runs of same-shaped windows."""
    group, size = config.group_size, config.pack_size
    n_groups = streams.shape[0]
    carried = np.empty((n_groups, 0), dtype=np.int64)
    for first_pack, n_windows, per_rank, read_from, hold in _carry_runs(
        n_packs, streams.shape[1], config
    ):
        count = per_rank * group * size
        fresh = count - carried.shape[1] + hold
        new = streams[:, read_from : read_from + n_windows * fresh].reshape(
            n_groups, n_windows, fresh
        )
        windows, carried = hold_back(new, carried, cost, hold, target_mean * count)
        planned = _plan_windows(windows.reshape(n_groups, -1), cost, tok, per_rank, config)
        _place(planned, config, first_pack, out)


def plan_epoch(
    costs: npt.NDArray[np.floating],
    order: npt.NDArray[np.integer],
    config: PlanConfig,
    tokens: npt.NDArray[np.integer] | None = None,
) -> Plan:
    """Plan one epoch. ``order``: sample ids in stream order (``epoch_order``); ``costs`` and
    ``tokens`` are indexed by sample id. ``tokens`` is required when ``config.max_tokens`` is set.
    Output: ``Plan.packs`` of shape (world_size, n_packs, pack_size).
    """
    cost = validate_costs(costs)
    ids = np.asarray(order, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"order must be 1-D, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= cost.size):
        raise ValueError(
            f"order holds sample ids outside [0, {cost.size}): min {ids.min()}, max {ids.max()}"
        )
    tok: npt.NDArray[np.int64] | None = None
    remainder: dict[str, npt.NDArray[np.int64]] = {}
    if config.max_tokens is not None:
        if tokens is None:
            raise ValueError("tokens are required when max_tokens is set")
        tok = np.asarray(tokens, dtype=np.int64)
        if tok.shape != cost.shape:
            raise ValueError(f"tokens shape {tok.shape} differs from costs shape {cost.shape}")
        too_long = tok[ids] > config.max_tokens
        remainder[REASON_TOO_LONG] = ids[too_long]
        ids = ids[~too_long]

    group, size = config.group_size, config.pack_size
    n_groups = config.world_size // group
    shortest = ids.size // n_groups
    n_packs = shortest // (group * size)
    streams, tail = _split_groups(ids, n_groups, n_packs * group * size)
    remainder[REASON_TAIL] = tail

    out = np.empty((config.world_size, n_packs, size), dtype=np.int64)
    if config.carry_records == 0:
        _plan_batched(streams, cost, tok, n_packs, config, out)
    else:
        target = float(cost[streams].mean()) if streams.size else 0.0
        _plan_with_carry(streams, cost, tok, n_packs, config, target, out)
    return Plan(out, remainder)
