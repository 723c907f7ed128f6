"""Who reads what in one epoch: node streams, planning rows and the pack count.

A node's stream is a pure function of (shard table, config, seed, epoch): every node reads only
its own shards (``dealing.deal_shards``, pieces of cut shards from ``cuts.cut_shards``), in
shard groups (``groups.shard_groups``) whose records are shuffled with the stratified shuffle
(``stratify.stratified_permutation``), so every node sees the whole dataset's mixture at every
moment while its shard cache stays bounded. Positions are resolved group by group: taking
records ``[a, b)`` permutes only the groups they touch, so a reader's memory is O(group), never
O(dataset), and no step sorts the whole dataset. ``shuffle=False`` keeps the write order:
shards dealt round robin, read in order, records in write order.

:class:`NodeStreams` is built from the shard table alone in O(shards): every process of every
node builds the same one without reading a record, so every rank knows every rank's pack count
(collectives never hang).

Planning rows: scope ``rank`` plans each rank on its own (row = rank); scope ``node`` plans
the P ranks of a node jointly (row = node); scope ``world`` plans the ranks of ``row_nodes``
nodes jointly (``PlanConfig.rows_for``: the row's nodes share one stream, dealt the shards of
all of them, so "node stream" below means the row's stream). A rank-scope row is the rank's share
of its node's stream, **interleaved**: the node stream is cut into chunks of W*B*P records and
rank r takes the r-th slice of every chunk, so window k of every rank of a node comes from the
same part of the stream (never contiguous 1/P chunks of the epoch: on ordered data those differ
in cost as whole sources do).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner import checks
from bcl_stream.planner.config import PlanConfig
from bcl_stream.planner.cuts import cut_shards
from bcl_stream.planner.dealing import deal_shards
from bcl_stream.planner.groups import NodeGroups, shard_groups
from bcl_stream.planner.heavy_lane import HeavyLane
from bcl_stream.planner.lru import Lru
from bcl_stream.planner.rng import Tag, epoch_rng
from bcl_stream.planner.shard_table import Ids, KeepFilter, ShardTable
from bcl_stream.planner.stratify import stratified_permutation


class NodeStream:
    """One node's records in stream order, materialized a group at a time.

    ``keep``: optional filter ``ids -> bool mask`` applied after the shuffle (memory cap,
    records consumed before an elastic resize); it must keep exactly ``table.usable`` records
    of each shard, which is what lets every process know every stream's length up front.
    ``window_records``: W*B (``PlanConfig.window_records``), with ``costs`` the unit of the
    stratified shuffle (every rank's window holds the group's mix); 0: a plain shuffle.
    """

    def __init__(
        self,
        table: ShardTable,
        node_shards: Ids,
        *,
        group: int,
        seed: int,
        epoch: int,
        node: int,
        shuffle: bool = True,
        keep: KeepFilter | None = None,
        costs: npt.NDArray[np.floating] | None = None,
        window_records: int = 0,
    ) -> None:
        self._costs = costs
        self._window_records = window_records
        self._seed, self._epoch, self._node = seed, epoch, node
        self._shuffle = shuffle
        self._keep = keep
        self._table, self._node_shards, self._group = table, node_shards, group
        self._length = int(table.usable[np.asarray(node_shards, dtype=np.int64)].sum())
        self._groups: NodeGroups | None = None
        self._stream = table.stream
        self._cache: Lru[int, Ids] = Lru(2)

    @property
    def groups(self) -> NodeGroups:
        """The node's shard groups, dealt on first use: a process that plans one node deals
        only that node's groups (every node's length comes from the shard table alone)."""
        if self._groups is None:
            rng = epoch_rng(self._seed, self._epoch, Tag.GROUP_DEAL, self._node)
            self._groups = shard_groups(
                self._table,
                self._node_shards,
                self._group,
                rng if self._shuffle else None,
                (self._seed, self._epoch),
                self._keep,
            )
            self._bounds = np.concatenate([[0], np.cumsum(self._groups.usable)]).astype(np.int64)
            self._ends = np.cumsum(self._table.counts)
            if int(self._bounds[-1]) != self._length:
                raise ValueError(
                    f"node {self._node}: its shard groups hold {int(self._bounds[-1])} records, "
                    f"its shards {self._length}: usable counts and filter disagree"
                )
        return self._groups

    @property
    def bounds(self) -> Ids:
        """Stream position where each group starts, and the stream's length last."""
        self.groups  # noqa: B018 (deals the groups on first use)
        return self._bounds

    def __len__(self) -> int:
        return self._length

    @property
    def shards(self) -> Ids:
        """Every shard this node reads this epoch."""
        return self.groups.shards

    def group_ids(self, g: int) -> Ids:
        """Group ``g``'s usable records in stream order (cached: the last two groups)."""
        hit = self._cache.get(g)
        if hit is not None:
            return hit
        ids = self._read_ranges(g)
        if self._shuffle:
            rng = epoch_rng(self._seed, self._epoch, Tag.GROUP_SHUFFLE, self._node, g)
            if self._costs is not None and self._window_records > 0:
                ids = stratified_permutation(
                    ids,
                    np.asarray(self._costs[ids]),
                    self._window_records,
                    rng,
                    self.labels(ids),
                    offset=int(self.bounds[g]),
                )
            else:
                ids = rng.permutation(ids)
        expected = int(self.bounds[g + 1] - self.bounds[g])
        if ids.size != expected:
            raise ValueError(
                f"the record filter kept {ids.size} records of group {g}, the shard table "
                f"says {expected}: usable counts and filter disagree"
            )
        self._cache.put(g, ids)
        return ids

    def _read_ranges(self, g: int) -> Ids:
        """Group ``g``'s kept records in range order (a mixture's: the slice of each range)."""
        ranges, slices = self.groups.ranges[g], self.groups.slices
        parts: list[Ids] = []
        for i, (lo, n) in enumerate(ranges):
            ids = np.arange(lo, lo + n, dtype=np.int64)
            if self._keep is not None:
                ids = ids[self._keep(ids)]
            if slices is not None:
                skip, take = slices[g][i]
                ids = ids[skip : skip + take]
            parts.append(ids)
        return np.concatenate(parts or [np.empty(0, np.int64)])

    def labels(self, ids: Ids) -> Ids | None:
        """The stream of each id for a mixture (kept together by the stratified shuffle)."""
        if self._stream is None:
            return None
        self.groups  # noqa: B018 (deals the groups, and the shard ends, on first use)
        return self._stream[np.searchsorted(self._ends, ids, side="right")]

    def take(self, positions: Ids) -> Ids:
        """Record ids at stream ``positions`` (any order, each < len)."""
        pos = np.asarray(positions, dtype=np.int64)
        out = np.empty(pos.shape, dtype=np.int64)
        if pos.size == 0:
            return out
        if pos.min() < 0 or pos.max() >= len(self):
            raise ValueError(f"positions must lie in [0, {len(self)})")
        flat, res = pos.reshape(-1), out.reshape(-1)
        group_of = np.searchsorted(self.bounds, flat, side="right") - 1
        for g in np.unique(group_of):
            sel = group_of == g
            res[sel] = self.group_ids(int(g))[flat[sel] - self.bounds[g]]
        return out


class NodeStreams:
    """The epoch's node streams and planning rows for one config, seed and epoch."""

    def __init__(
        self,
        table: ShardTable,
        config: PlanConfig,
        seed: int,
        epoch: int,
        keep: KeepFilter | None = None,
        costs: npt.NDArray[np.floating] | None = None,
    ) -> None:
        config = config.rows_for(table.counts.size)
        self.config = config
        """The config planned: the caller's, with the rows the data asks for
        (:meth:`PlanConfig.rows_for`; rows, ranks and windows below follow it)."""
        _check_inputs(table, config, seed, epoch, keep, costs)
        table = cut_shards(
            table,
            config.stream_nodes,
            shard_group=config.shard_group,
            split_shards=config.split_shards,
            max_amplification=max(config.max_amplification / config.row_nodes, 1.0),
            costs=costs,
            keep=keep,
        )
        self.table = table
        """The shard table the streams read: the heaviest shards may be split in pieces."""
        self.seed, self.epoch = seed, epoch
        self.keep = keep
        """The epoch's record filter (memory cap, exclusions, a mixture's draw), or None."""
        node_shards = deal_shards(table, config.stream_nodes, seed, epoch, shuffle=config.shuffle)
        self.nodes = [
            NodeStream(
                table,
                shards,
                group=config.shard_group,
                seed=seed,
                epoch=epoch,
                node=n,
                shuffle=config.shuffle,
                keep=keep if keep is not None and keep.active else None,
                costs=costs if config.stratify else None,
                window_records=config.window_records,
            )
            for n, shards in enumerate(node_shards)
        ]
        per_node = config.stream_ranks * config.pack_size
        self.n_packs = min(len(s) for s in self.nodes) // per_node
        """Packs per rank, the same on every rank: the shortest node stream decides."""
        self.lane = HeavyLane(
            self.nodes,
            window=config.window,
            pack_size=config.pack_size,
            ranks_per_node=config.stream_ranks,
            lane=config.lane if config.shuffle else 0,
            n_packs=self.n_packs,
            costs=costs,
            threshold=config.lane_threshold * config.pack_size * table.mean_cost,
        )
        """Node-stream positions to ids, with the heavy lane applied (a plain shuffle without
        costs, or ``shuffle=False``, has no lane)."""

    @property
    def n_records(self) -> int:
        """Records in the dataset (every id the streams may hold is below this)."""
        return self.table.n_records

    @property
    def n_rows(self) -> int:
        return self.config.n_rows

    @property
    def row_length(self) -> int:
        """Records each planning row emits this epoch."""
        return self.n_packs * self.config.row_ranks * self.config.pack_size

    @property
    def n_windows(self) -> int:
        return -(-self.n_packs // self.config.window)

    def node_of_row(self, row: int) -> int:
        return row if self.config.row_ranks > 1 else row // self.config.stream_ranks

    def node_positions(self, row: int, positions: Ids) -> Ids:
        """Node-stream positions of a row's stream positions (identity for node rows)."""
        c = self.config
        if c.row_ranks > 1:
            return positions
        span = c.window_records  # a rank's slice of one window of the node's stream
        full = self.n_packs // c.window
        k, off = np.divmod(positions, span)
        piece = np.where(k < full, span, (self.n_packs % c.window) * c.pack_size)
        local = row % c.stream_ranks
        return k * span * c.stream_ranks + local * piece + off

    def fetch(self, rows: npt.ArrayLike, start: int, stop: int) -> Ids:
        """(len(rows), stop - start) record ids at row-stream positions [start, stop)."""
        row_ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        if not 0 <= start <= stop <= self.row_length:
            raise ValueError(f"positions [{start}, {stop}) outside [0, {self.row_length})")
        positions = np.arange(start, stop, dtype=np.int64)
        out = np.empty((row_ids.size, stop - start), dtype=np.int64)
        for i, row in enumerate(row_ids):
            node = self.node_of_row(int(row))
            out[i] = self.lane.take(node, self.node_positions(int(row), positions))
        return out

    def tail(self, node: int) -> Ids:
        """Records of a node's stream that no rank emits this epoch (``epoch_tail``)."""
        stream = self.nodes[node]
        used = self.n_packs * self.config.stream_ranks * self.config.pack_size
        return stream.take(np.arange(used, len(stream), dtype=np.int64))


def _check_inputs(
    table: ShardTable,
    config: PlanConfig,
    seed: object,
    epoch: object,
    keep: KeepFilter | None,
    costs: npt.NDArray[np.floating] | None,
) -> None:
    """Refuse inputs that would otherwise fail deep inside numpy, naming the argument."""
    checks.integer(seed, "seed", 0, (1 << 128) - 1)
    checks.integer(epoch, "epoch", 0)
    n = table.n_records
    if costs is not None:
        checks.per_record(costs, "costs", n)
    if keep is not None and keep.tokens is not None:
        checks.per_record(keep.tokens, "keep filter tokens", n)
    if table.split is not None:
        cut = table.split[table.split >= 0]
        pieces = np.unique(cut, return_counts=True)[1]
        if np.any((pieces < 2) | (pieces > config.stream_nodes)):
            raise ValueError(
                f"split: every cut shard must have 2 to {config.stream_nodes} pieces (one per node "
                f"at most), got {sorted(set(pieces.tolist()))}"
            )
