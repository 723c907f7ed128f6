"""Who reads what in one epoch: node streams, planning rows and the pack count.

Built from the shard table alone in O(shards): every process of every node builds the same
:class:`NodeStreams` without reading a record, so every rank knows every rank's pack count
(collectives never hang) and can compute any node's upcoming window (scope ``world``).

Planning rows: scope ``rank`` plans each rank on its own (row = rank); scopes ``node`` and
``world`` plan the P ranks of a node jointly (row = node). A rank-scope row is the rank's share
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
from bcl_stream.planner.order import (
    Ids,
    KeepFilter,
    NodeStream,
    ShardTable,
    deal_shards,
    split_heavy_shards,
)


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
        self.config = config
        _check_inputs(table, config, seed, epoch, keep, costs)
        table = split_heavy_shards(table, config.n_nodes, config.split_shards, costs, keep)
        self.table = table
        """The shard table the streams read: the heaviest shards may be split in pieces."""
        self.seed, self.epoch = seed, epoch
        node_shards = deal_shards(table, config.n_nodes, seed, epoch, shuffle=config.shuffle)
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
                unit=config.window * config.pack_size,
            )
            for n, shards in enumerate(node_shards)
        ]
        per_node = config.ranks_per_node * config.pack_size
        self.n_packs = min(len(s) for s in self.nodes) // per_node
        """Packs per rank, the same on every rank: the shortest node stream decides."""

    @property
    def n_records(self) -> int:
        """Records in the dataset (every id the streams may hold is below this)."""
        return self.table.n_records

    @property
    def n_rows(self) -> int:
        return self.config.world_size // self.config.group_size

    @property
    def row_length(self) -> int:
        """Records each planning row emits this epoch."""
        return self.n_packs * self.config.group_size * self.config.pack_size

    @property
    def n_windows(self) -> int:
        return -(-self.n_packs // self.config.window)

    def node_of_row(self, row: int) -> int:
        return row if self.config.group_size > 1 else row // self.config.ranks_per_node

    def node_positions(self, row: int, positions: Ids) -> Ids:
        """Node-stream positions of a row's stream positions (identity for node rows)."""
        c = self.config
        if c.group_size > 1:
            return positions
        chunk = c.window * c.pack_size  # one rank's slice of a full chunk
        full = self.n_packs // c.window
        k, off = np.divmod(positions, chunk)
        piece = np.where(k < full, chunk, (self.n_packs % c.window) * c.pack_size)
        local = row % c.ranks_per_node
        return k * chunk * c.ranks_per_node + local * piece + off

    def fetch(self, rows: npt.ArrayLike, start: int, stop: int) -> Ids:
        """(len(rows), stop - start) sample ids at row-stream positions [start, stop)."""
        row_ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        if not 0 <= start <= stop <= self.row_length:
            raise ValueError(f"positions [{start}, {stop}) outside [0, {self.row_length})")
        positions = np.arange(start, stop, dtype=np.int64)
        out = np.empty((row_ids.size, stop - start), dtype=np.int64)
        for i, row in enumerate(row_ids):
            node = self.nodes[self.node_of_row(int(row))]
            out[i] = node.take(self.node_positions(int(row), positions))
        return out

    def tail(self, node: int) -> Ids:
        """Records of a node's stream that no rank emits this epoch (``epoch_tail``)."""
        stream = self.nodes[node]
        used = self.n_packs * self.config.ranks_per_node * self.config.pack_size
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
        if np.any(pieces != config.n_nodes):
            raise ValueError(
                f"split: every cut shard must have one piece per node ({config.n_nodes}), got "
                f"{sorted(set(pieces.tolist()))}"
            )
