"""The token-budget contract: micro-batches of at most T tokens, balanced on cost, equal in count.

``PlanConfig.contract="tokens"`` with ``max_tokens`` T (per data-parallel rank and
micro-batch). What the trainer is promised:

- **Memory**: no micro-batch holds more than T tokens: the sum of its records' tokens under the
  ``packed`` layout, its rows x its longest record under ``padded`` (:func:`pack_window_padded`).
- **Equal counts**: every rank yields ``M`` micro-batches per window, M = ``window`` rounded up
  to a multiple of ``grad_accum`` G, and the same number of windows per epoch, so every
  optimizer step holds exactly G micro-batches on every rank and every rank runs the same
  number of steps. Both follow from the shard table and the index's token counts alone
  (:func:`token_geometry`): no collective, no empty or dummy micro-batch.
- **Balance**: a row's (one rank, a node, a row of nodes: the scope) window is packed into
  M*P bins of capacity T by LPT on cost (the cost model's quadratic term included, not token
  counts), then refined by moves from the costliest bin to the cheapest; bins run costliest
  first, P per step, and with G > 1 each step's bins go to ranks so that per-step sums even
  out (``windows.rank_order``).
- **Fill**: a window reads the records whose expected tokens fill :data:`FILL` of its M*P
  bins (the epoch's mean fed length, from the index), so bins are ~FILL full and records
  rarely miss.
- **Coverage**: a record that does not fit into its window's bins is carried into the next
  window (packed again with it); the carry chain restarts every ``carry_span`` windows, and
  records still unplaced at the end of a chain (or the epoch) are reported as
  :data:`REASON_OVER_BUDGET`, never dropped silently. Records longer than T are left out by
  the streams' filter (``longer_than_max_tokens``) unless ``max_seq_len`` cuts them first.

Records per micro-batch vary; the plan pads each batch of micro-batches to its widest with
:data:`EMPTY` (-1), which readers strip. Resume: micro-batch k of a rank is a pure function of
(index, config, seed, epoch); a reader starting at window k replays at most ``carry_span - 1``
windows of its own row (packing only, no reading), as the record contract's carry does.

Geometry: the node streams are those of the record contract, built with ``pack_size`` =
records one rank reads per optimizer step and ``window`` = M / G steps (:func:`token_geometry`),
so shard dealing, the stratified shuffle, scopes and rows are shared unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.config import PlanConfig
from bcl_stream.planner.contracts import contract
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.shard_table import Ids
from bcl_stream.planner.windows import rank_order

REASON_OVER_BUDGET = "over_token_budget"
"""Remainder reason: a record that found no room under the budget before its carry chain
ended (it waited up to ``carry_span`` windows)."""
FILL = 0.98
"""Share of a window's token capacity (M*P*T) that its fresh records are expected to fill,
for rows of at least :data:`WIDE_ROW` bins a window. Below 1 so that the carry drains: the
bins' spare room takes what earlier windows held over, which keeps the over-budget remainder
near empty. Chosen on the tuning corpora (``tools/bench_tokens.py``, ``text_corpora.TUNE``,
200K records, 1 x 8, T = 16,384, G = 4): 0.95 / 0.97 / 0.98 / 0.99 gave fill 0.94-0.96 /
0.96-0.97 / 0.98-0.99 / 0.98-0.99 at the same bcl-world efficiency and no record over budget
at any of them in scope ``world``; 0.99 left 3,213 of 50K records over budget on the mixed
corpus (its changelog run: windows whose records are longer than the epoch's mean), 0.97 and
0.98 left 166 there (0.3%) and none at 200K. Fill matters at a fixed per-micro-batch price:
0.95 -> 0.98 is about 3% fewer micro-batches, 0.3-0.6% of modeled time at F = 0.1. (First
chosen as 0.95 on 50K records; at 0.97 scope ``rank`` left up to 959 records over budget on
code:torch, which is why narrow rows keep :data:`FILL_NARROW`.)"""
FILL_NARROW = 0.92
""":data:`FILL` for rows of fewer than :data:`WIDE_ROW` bins a window (scope ``rank``, or few
ranks a node): few bins pack long records less tightly, so the carry grows at 0.95 (a
synthetic heavy tail at T = 4,096 and 8 bins: 1% of the records over budget at 0.95)."""
WIDE_ROW = 64
"""Bins a row packs per window from which :data:`FILL` applies."""
EMPTY = -1
"""Padding of a micro-batch row past its records (readers strip it)."""


def micro_batches_per_window(config: PlanConfig) -> int:
    """M: ``window`` rounded up to a multiple of ``grad_accum`` (whole steps per window)."""
    g = config.grad_accum
    return -(-config.window // g) * g


def planning_window(config: PlanConfig) -> int:
    """Micro-batches per rank of one planning window under ``config``'s contract: M under a
    budget contract (:func:`micro_batches_per_window`), else the record contract's W packs.
    What per-window work keyed to the plan (the two-term refinement) counts in."""
    return micro_batches_per_window(config) if contract(config.contract).budget else config.window


MEAN_CHUNK = 1 << 22
"""Token counts read at a time by :func:`mean_fed_tokens` (a memory-mapped index of 10^8
records is never copied whole: 800 MB as int64)."""


def mean_fed_tokens(tokens: npt.NDArray[np.integer], max_tokens: int) -> float:
    """Mean tokens of the records within the budget (every process computes the same), read
    in chunks of :data:`MEAN_CHUNK`. The integer sum is exact, and so is the float64 sum
    numpy's ``mean`` took before (integers below 2^53), so the value is the same. Each chunk
    is summed whole in its stored dtype (int64 accumulator), less its records over the
    budget (few): no int64 copy and no compressed copy of the kept records, a third of the
    time on a mapped index of 10^8 records."""
    total = count = 0
    for lo in range(0, len(tokens), MEAN_CHUNK):
        chunk = np.asarray(tokens[lo : lo + MEAN_CHUNK])
        over = chunk > max_tokens
        n_over = int(np.count_nonzero(over))
        total += int(chunk.sum(dtype=np.int64))
        if n_over:
            total -= int(chunk[over].sum(dtype=np.int64))
        count += chunk.size - n_over
    return total / count if count else float(max_tokens)


PADDED_SAMPLE = 8
"""Windows drawn to estimate the padded layout's room per record (:func:`padded_room`)."""


def padded_room(
    tokens: npt.NDArray[np.integer], max_tokens: int, n_bins: int, fill: float
) -> float:
    """Under the ``padded`` layout: the mean budget tokens a record takes (its own plus the
    padding its micro-batch gives it), as :func:`pack_window_padded` cuts a window of
    ``n_bins`` bins. Padding depends on how close in length a window's sorted records are,
    so on the window's size: estimated on :data:`PADDED_SAMPLE` windows of records drawn with
    a fixed seed from the records within the budget, each cut whole into sorted chunks
    (the intake of a window then follows from the estimate; two rounds of that fixed point).
    A pure function of the index and the config: the same in every process."""
    values = np.asarray(tokens[:], dtype=np.int64)
    kept = values[values <= max_tokens]
    if not kept.size:
        return float(max_tokens)
    draw = np.random.default_rng(0).permutation(kept)
    room = float(kept.mean())
    for _ in range(2):
        size = max(1, min(draw.size, round(n_bins * max_tokens * fill / room)))
        used = [
            _sorted_chunks(np.sort(draw[i : i + size])[::-1], max_tokens) * max_tokens / size
            for i in range(0, min(draw.size - size, (PADDED_SAMPLE - 1) * size) + 1, size)
        ]
        room = float(np.mean(used))
    return room


def _sorted_chunks(desc: npt.NDArray[np.int64], capacity: int) -> int:
    """Chunks :func:`pack_window_padded` cuts records sorted longest first into, unbounded."""
    at, chunks, n = 0, 0, desc.size
    while at < n:
        at += max(1, capacity // max(int(desc[at]), 1))
        chunks += 1
    return chunks


def row_bins(config: PlanConfig, n_shards: int | None = None) -> int:
    """Bins a planning row packs per window: M times the row's ranks, scope ``world``'s rows
    as ``rows_for`` widens them for ``n_shards`` shards (None: a node's ranks)."""
    if n_shards is None:
        row = 1 if config.scope == "rank" else config.ranks_per_node
    else:
        row = config.rows_for(n_shards).row_ranks
    return micro_batches_per_window(config) * row


def fill(config: PlanConfig, n_shards: int | None = None) -> float:
    """The fill a window's intake aims at: :data:`FILL`, or :data:`FILL_NARROW` for rows of
    fewer than :data:`WIDE_ROW` bins a window: M times the row's ranks, scope ``world``'s rows
    as ``rows_for`` widens them for ``n_shards`` shards (None: a node's ranks). Every process
    computes the same: it depends on the config and the shard count alone."""
    return FILL if row_bins(config, n_shards) >= WIDE_ROW else FILL_NARROW


def token_geometry(
    config: PlanConfig, tokens: npt.NDArray[np.integer], n_shards: int | None = None
) -> PlanConfig:
    """The record geometry the streams are built with under the tokens contract: a "pack" is
    one optimizer step of one rank, ``pack_size`` = the records it reads, ``round(G * T *
    FILL / mean)`` (at least G), with the mean fed length over records within the budget (a
    pure function of the index and T: the same on every rank, and across an elastic
    resume), and ``window`` = M / G steps. So the epoch's last window may hold fewer steps,
    and what no rank reads (``epoch_tail``) is less than a step per rank, under half a step
    once :func:`even_steps` has evened the intake (``planner.bcl.build_token_streams``). The record
    contract's carry and heavy lane are off (this contract carries what does not fit, and
    its records are bounded by T). ``n_shards``: the dataset's shard count, which decides
    scope ``world``'s rows (:func:`fill`). Under the ``padded`` layout the mean is the room a
    record takes with its padding (:func:`padded_room`), so a window reads fewer records."""
    if config.max_tokens is None:
        raise ValueError("contract='tokens' needs max_tokens, the token budget T")
    share = fill(config, n_shards)
    if config.layout == "padded":
        mean = padded_room(tokens, config.max_tokens, row_bins(config, n_shards), share)
    else:
        mean = mean_fed_tokens(tokens, config.max_tokens)
    g = config.grad_accum
    per_step = max(g, round(g * config.max_tokens * share / max(mean, 1.0)))
    steps = micro_batches_per_window(config) // g
    return replace(config, pack_size=per_step, window=steps, carry=0, lane=0)


TAIL_STEP = 0.5
"""The least share of a step's intake (:func:`token_geometry`'s ``pack_size``) the records
past the shortest stream's last whole step must hold to become one more step
(:func:`even_steps`)."""


def even_steps(geometry: PlanConfig, shortest: int, stream_ranks: int) -> PlanConfig:
    """``geometry`` with the step's intake lowered so the shortest stream (``shortest``
    records, ``stream_ranks`` ranks reading it) divides into one more whole step, where the
    records past its last whole step hold at least :data:`TAIL_STEP` of a step; else
    ``geometry`` unchanged.

    Why: the streams emit whole steps (the shortest stream decides their number) and what is
    past the last one is the epoch's tail, up to a step per rank. With many steps that is lost
    in rounding; with few (64 nodes x 8 ranks on a 1M-record corpus: 5.9 steps per rank) it was
    12-15% of the records. Spreading a partial step over the whole ones lowers the fill by
    less than 1 / (steps + 1) and never raises it (the over-budget carry stays as it was); a
    smaller partial step is left in the tail, where it costs fewer records than one more step
    of micro-batches costs overhead. Where a step reads few records the intake moves by whole
    records: evening is skipped when a record less per step would lower the fill by more than
    the partial step adds (changelogs at 64 x 8: 14 records a step, 139.5 steps). A pure function of the index and the config, like the
    geometry itself."""
    step = stream_ranks * geometry.pack_size
    whole, part = divmod(shortest, step)
    if part < TAIL_STEP * step:
        return geometry
    size = shortest // ((whole + 1) * stream_ranks)
    if size < geometry.grad_accum or size * (whole + 1) < (whole + TAIL_STEP) * geometry.pack_size:
        return geometry  # a whole record less a step reads less than the partial step adds
    return replace(geometry, pack_size=size)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Micro-batches of a range of windows for some rows."""

    packs: Ids
    """(rows * row_ranks, micro-batches, width) record ids, :data:`EMPTY` past each one's."""
    first_pack: int
    """Index of the first micro-batch of the range in the epoch."""
    dropped: Ids
    """Records of these windows that ended a carry chain unplaced (:data:`REASON_OVER_BUDGET`)."""


def pack_window(
    ids: Ids,
    tokens: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    n_bins: int,
    capacity: int,
    refine: int = 8,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Pack one window's records into ``n_bins`` bins of at most ``capacity`` tokens.

    LPT on cost under the capacity: records costliest first, each into the cheapest bin with
    room for its tokens. Then ``refine`` * ``n_bins`` moves of one record from the costliest
    bin to the cheapest where it fits and lowers the larger of the two. Output: (bin of each
    record, -1 for none; each bin's cost). No bin is left empty when there are ``n_bins``
    records or more (the first ``n_bins`` records open one bin each; a move never empties a
    bin).
    """
    n = ids.size
    tok = np.asarray(tokens, dtype=np.int64)
    cost = np.asarray(costs, dtype=np.float64)
    where = np.full(n, -1, dtype=np.int64)
    load = np.zeros(n_bins)
    room = np.full(n_bins, capacity, dtype=np.int64)
    rows = np.zeros(n_bins, dtype=np.int64)
    order = np.lexsort((np.arange(n), -tok, -cost))  # costliest first, longest on ties
    heap = [(0.0, b) for b in range(n_bins)]
    tok_l, cost_l = tok.tolist(), cost.tolist()
    for i in order.tolist():
        aside = []
        chosen = -1
        while heap:  # the cheapest bin with room (bins without room wait aside)
            c, b = heapq.heappop(heap)
            if tok_l[i] <= room[b]:
                chosen = b
                break
            aside.append((c, b))
        if chosen >= 0:
            rows[chosen] += 1
            room[chosen] -= tok_l[i]
            load[chosen] += cost_l[i]
            where[i] = chosen
            heapq.heappush(heap, (float(load[chosen]), chosen))
        for item in aside:
            heapq.heappush(heap, item)
    if refine > 0 and n_bins > 1:
        _refine(where, tok, cost, load, room, rows, refine * n_bins)
    return where, load


def _refine(
    where: npt.NDArray[np.int64],
    tok: npt.NDArray[np.int64],
    cost: npt.NDArray[np.float64],
    load: npt.NDArray[np.float64],
    room: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    moves: int,
) -> None:
    """Move records from the costliest bin to the cheapest while that lowers the larger of
    the two and fits its budget (in place)."""
    for _ in range(moves):
        a, b = int(load.argmax()), int(load.argmin())
        gap = load[a] - load[b]
        if gap <= 0 or rows[a] <= 1:
            return
        members = np.flatnonzero(where == a)
        c = cost[members]
        ok = (tok[members] <= room[b]) & (c < gap)
        if not ok.any():
            return
        pick = members[ok][np.abs(c[ok] - gap / 2).argmin()]
        where[pick] = b
        load[a] -= cost[pick]
        load[b] += cost[pick]
        room[a] += tok[pick]
        room[b] -= tok[pick]
        rows[a] -= 1
        rows[b] += 1


def pack_window_padded(
    ids: Ids,
    tokens: npt.NDArray[np.int64],
    costs: npt.NDArray[np.float64],
    n_bins: int,
    capacity: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """:func:`pack_window` for the ``padded`` layout: a micro-batch of r records whose longest
    has L tokens holds r x L <= ``capacity`` tokens and costs r x its costliest record
    (``planner/padded.py``).

    Records longest first are cut into consecutive chunks, each as many rows as its first
    (longest) record allows (``capacity // L``): sorted chunks pad least, and neighbouring
    lengths share a micro-batch, as the record contract's padded partition does. Records past
    the ``n_bins``-th chunk (the shortest) are left out (-1: the walker carries them). When
    fewer chunks than ``n_bins`` come out, the chunk with the most rows is halved until there
    are ``n_bins`` (a part of a chunk fits wherever the chunk did), so no bin is empty when
    there are ``n_bins`` records or more. Output as :func:`pack_window`'s: (bin of each record,
    -1 for none; each bin's padded cost).
    """
    n = ids.size
    tok = np.asarray(tokens, dtype=np.int64)
    cost = np.asarray(costs, dtype=np.float64)
    order = np.lexsort((np.arange(n), -cost, -tok))  # longest first, costliest on ties
    chunks: list[tuple[int, int]] = []  # [start, stop) in ``order``
    at = 0
    while at < n and len(chunks) < n_bins:
        rows = max(1, capacity // max(int(tok[order[at]]), 1))
        chunks.append((at, min(at + rows, n)))
        at = chunks[-1][1]
    while len(chunks) < n_bins:
        widest = max(range(len(chunks)), key=lambda j: (chunks[j][1] - chunks[j][0], -j))
        lo, hi = chunks[widest]
        if hi - lo < 2:
            break
        mid = lo + (hi - lo) // 2
        chunks[widest : widest + 1] = [(lo, mid), (mid, hi)]
    where = np.full(n, -1, dtype=np.int64)
    load = np.zeros(n_bins)
    for b, (lo, hi) in enumerate(chunks):
        members = order[lo:hi]
        where[members] = b
        load[b] = (hi - lo) * cost[members].max()
    return where, load


def _order_bins(
    load: npt.NDArray[np.float64], group: int, first_pack: int, config: PlanConfig
) -> npt.NDArray[np.int64]:
    """(per_rank, group) bin index each rank runs at each micro-batch of the window: bins
    costliest first, ``group`` per step; with G > 1 a step's heaviest bin goes to the rank
    with the least work so far in the optimizer step (``windows.rank_order``)."""
    by_load = np.argsort(-load, kind="stable")
    per_rank = load.size // group
    who = rank_order(load[by_load][None, None, :], first_pack, config)
    grid = by_load.reshape(per_rank, group)
    return np.take_along_axis(grid, who[0, 0], axis=1)


def _window_packs(
    ids: Ids, where: npt.NDArray[np.int64], bins: npt.NDArray[np.int64]
) -> list[list[Ids]]:
    """[rank][micro-batch] record ids from a window's bin assignment and bin order, each
    micro-batch's records costliest first (the order they were packed)."""
    per_rank, group = bins.shape
    members: list[list[int]] = [[] for _ in range(bins.size)]
    for i, b in enumerate(where.tolist()):
        if b >= 0:
            members[b].append(i)
    return [
        [ids[np.asarray(members[int(bins[t, r])], dtype=np.int64)] for t in range(per_rank)]
        for r in range(group)
    ]


class TokenWalker:
    """Walks the epoch's windows of some rows under the tokens contract (window by window,
    carry chains replayed from their start): the token contract's :func:`iter_windows`."""

    def __init__(
        self,
        streams: NodeStreams,
        costs: npt.NDArray[np.floating],
        tokens: npt.NDArray[np.integer],
        config: PlanConfig,
    ) -> None:
        self.streams = streams
        self.costs = costs
        self.tokens = tokens
        self.config = config
        """The caller's config (``window``, ``grad_accum``, ``max_tokens``, ``refine``)."""
        self.per_window = micro_batches_per_window(config)

    @property
    def n_windows(self) -> int:
        """Windows per rank, the same on every rank (the record geometry's)."""
        return self.streams.n_windows

    @property
    def n_packs(self) -> int:
        """Micro-batches per rank, the same on every rank: G per step of the record geometry
        (a multiple of G)."""
        return self.streams.n_packs * self.config.grad_accum

    def window_micro_batches(self, k: int) -> int:
        """Micro-batches per rank of window ``k`` (M; the epoch's last may hold fewer)."""
        return min(self.per_window, self.n_packs - k * self.per_window)

    def span(self) -> int:
        """Windows per carry chain."""
        return self.config.carry_span or max(self.n_windows, 1)

    def walk(
        self, rows: npt.ArrayLike, first: int = 0, stop: int | None = None
    ) -> Iterator[TokenBatch]:
        """One :class:`TokenBatch` per window ``first`` .. ``stop`` (default: the epoch's end)
        of ``rows``; the carry into ``first`` is replayed from its chain's start."""
        row_ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        end = self.n_windows if stop is None else min(stop, self.n_windows)
        span = self.span()
        carries: list[Ids] = [np.empty(0, np.int64) for _ in row_ids]
        for k in range(first - first % span, end):
            if k % span == 0:
                carries = [np.empty(0, np.int64) for _ in row_ids]
            emit = k >= first
            outs: list[list[Ids]] = []
            dropped: list[Ids] = []
            for i, row in enumerate(row_ids.tolist()):
                packs, carries[i] = self._window(int(row), k, carries[i], emit)
                if carries[i].size and (k % span == span - 1 or k == self.n_windows - 1):
                    dropped.append(carries[i])
                    carries[i] = np.empty(0, np.int64)
                outs.extend(packs)
            if emit:
                yield TokenBatch(
                    _pad(outs),
                    k * self.per_window,
                    np.concatenate(dropped) if dropped else np.empty(0, np.int64),
                )

    def _window(self, row: int, k: int, carry: Ids, emit: bool) -> tuple[list[list[Ids]], Ids]:
        """Rank-by-rank micro-batches of window ``k`` of ``row`` (empty list unless ``emit``),
        and the records it carries into the next window."""
        geometry = self.streams.config
        size = geometry.pack_size * geometry.row_ranks  # records of one step of the row
        first_step = k * geometry.window
        steps = self.window_micro_batches(k) // self.config.grad_accum
        fresh = self.streams.fetch([row], first_step * size, (first_step + steps) * size)[0]
        ids = np.concatenate([carry, fresh])
        tok = np.asarray(self.tokens[ids], dtype=np.int64)
        cost = np.asarray(self.costs[ids], dtype=np.float64)
        group = geometry.row_ranks
        assert self.config.max_tokens is not None
        n_bins = self.window_micro_batches(k) * group
        if self.config.layout == "padded":
            where, load = pack_window_padded(ids, tok, cost, n_bins, self.config.max_tokens)
        else:
            where, load = pack_window(
                ids, tok, cost, n_bins, self.config.max_tokens, self.config.refine
            )
        left = ids[where < 0]
        if not emit:
            return [], left
        bins = _order_bins(load, group, k * self.per_window, geometry)
        return _window_packs(ids, where, bins), left


def _pad(ranks: list[list[Ids]]) -> Ids:
    """[rank][micro-batch] ids -> (ranks, micro-batches, widest) padded with :data:`EMPTY`."""
    width = max((p.size for rank in ranks for p in rank), default=0)
    n = len(ranks[0]) if ranks else 0
    out = np.full((len(ranks), n, max(width, 1)), EMPTY, dtype=np.int64)
    for r, rank in enumerate(ranks):
        for t, pack in enumerate(rank):
            out[r, t, : pack.size] = pack
    return out


def unpad(row: Ids) -> Ids:
    """A micro-batch's record ids without the padding."""
    return row[row != EMPTY]


def plan_tokens(walker: TokenWalker) -> tuple[Ids, Ids]:
    """The whole epoch of every row: (micro-batches (world_size, n_packs, widest) padded with
    :data:`EMPTY`, records reported :data:`REASON_OVER_BUDGET`)."""
    streams = walker.streams
    batches = list(walker.walk(np.arange(streams.n_rows)))
    width = max((b.packs.shape[2] for b in batches), default=1)
    out = np.full((streams.config.world_size, walker.n_packs, width), EMPTY, dtype=np.int64)
    for b in batches:
        out[:, b.first_pack : b.first_pack + b.packs.shape[1], : b.packs.shape[2]] = b.packs
    dropped = [b.dropped for b in batches if b.dropped.size]
    return out, np.sort(np.concatenate(dropped)) if dropped else np.empty(0, np.int64)
