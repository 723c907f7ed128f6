"""Random streams of the planner: one generator per (seed, epoch, stream tag, ...).

Every process of every node draws the same numbers from the same tags, which is how ranks agree
on the epoch's order without communicating. **The tags are part of the checkpoint contract**: a
saved cursor replays an epoch by recomputing its plan, so changing a tag's value (or reusing one
for another purpose) silently changes every saved run's epoch order. Add new tags; never renumber.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Tag(IntEnum):
    """The planner's random-stream tags (values fixed forever: see the module docstring)."""

    NODE_DEAL = 0
    """Shards (and cut pieces) to nodes (``dealing.deal_shards``)."""
    GROUP_DEAL = 1
    """A node's shards to its shard groups (``groups.shard_groups``), per node."""
    GROUP_SHUFFLE = 2
    """The stratified shuffle of one group (``node_streams.NodeStream``), per node and group."""
    GLOBAL_ORDER = 3
    """The central peers' global shuffle (``bcl_stream.peers.pools.global_order``)."""
    GROUP_ORDER = 4
    """The order of a node's groups, shared by every node (``groups.shard_groups``)."""
    MIXTURE_DRAW = 7
    """A mixture stream's per-shard record order and phase (``mixture``), per stream."""


def epoch_rng(seed: int, epoch: int, tag: Tag, *more: int) -> np.random.Generator:
    """The generator for one (seed, epoch) and stream ``tag``; ``more`` separates its uses
    (a node, a group)."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return np.random.default_rng([seed, epoch, int(tag), *more])
