"""Canonical ranks, the pure part: a plan for V canonical ranks as R physical ranks run it.

**Hosting** (fixed for the epoch, so a node reads the same shards throughout): physical node n
of N = R/P hosts P*k canonical ranks (k = V/R). Where a physical node holds whole canonical
nodes (P*k a multiple of the canonical node size P_c) it hosts canonical nodes n, n+N, n+2N, ...
(strided): a canonical node's shards are read by one physical node (amplification as in the
canonical layout), and each physical node mixes canonical nodes from across the world, whose
step totals differ (rows of a world plan are not perfectly aligned): measured on a code corpus
at 64 x 8 canonical ranks, 1M records, run on 16 x 8, 0.969 strided against 0.952 for
consecutive canonical nodes (``tools/bench_elastic.py --canonical``). Otherwise (a canonical
node larger than a physical node's share) it hosts P*k consecutive canonical ranks.

**Dealing** (every step): the node's P*k*G_c packs of the step go to its P ranks, k*G_c each,
heaviest first in snake order, and every rank runs its share heaviest first: the m-th
micro-batch of every rank of every node is of the m-th cost round, so micro-batches stay
alike across ranks (FSDP synchronizes every micro-batch) and per-step sums balance within the
node. Packs never leave the node that hosts them (locality), and the step's set of packs is
the canonical plan's whatever R. The order depends on the costs only: identical in every
process, for any number of DataLoader workers. ``balanced=False`` (the ``sequential``
baseline): rank i of a node runs the node's hosted canonical ranks i*k .. i*k+k-1, micro-batch
t of each in turn, then t+1.

Readers walk this lazily (``bcl_stream/epoch/canonical.py``); the simulator and the benchmark
score whole plans (:func:`physical_packs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

HOSTINGS = ("strided", "consecutive")
"""How whole canonical nodes are hosted: ``strided`` (the default, module docstring) or
``consecutive`` (physical node n hosts canonical nodes n*c .. n*c+c-1: what it is measured
against in ``tools/bench_elastic.py --canonical``)."""


def node_hosts(
    canonical: int,
    canonical_per_node: int,
    ranks: int,
    ranks_per_node: int,
    node: int,
    hosting: str = "strided",
) -> list[int]:
    """The canonical ranks physical ``node`` hosts, in the order its ranks take them
    (rank i of the node: entries i*k .. i*k+k-1 under ``balanced=False``)."""
    if hosting not in HOSTINGS:
        raise ValueError(f"hosting must be one of {HOSTINGS}, got {hosting!r}")
    if canonical % ranks or ranks % ranks_per_node:
        raise ValueError(
            f"{ranks} ranks ({ranks_per_node} per node) cannot host {canonical} canonical ranks"
        )
    nodes = ranks // ranks_per_node
    if not 0 <= node < nodes:
        raise ValueError(f"node must be in [0, {nodes}), got {node}")
    share = canonical // nodes  # P*k canonical ranks per physical node
    if share % canonical_per_node == 0 and hosting == "strided":
        per = share // canonical_per_node  # whole canonical nodes, strided over the world
        cnodes = [node + j * nodes for j in range(per)]
        return [c * canonical_per_node + i for c in cnodes for i in range(canonical_per_node)]
    return list(range(node * share, node * share + share))


def deal_step(
    step: npt.NDArray[np.int64], costs: Any, ranks_per_node: int, balanced: bool = True
) -> npt.NDArray[np.int64]:
    """One node's step: ``step`` (H, g, B) packs of its H hosted canonical ranks -> (P, H*g/P, B)
    micro-batches of its P ranks (module docstring). Under the tokens contract B is the widest
    micro-batch and rows are padded with -1 (no record): a micro-batch moves whole, so each
    physical micro-batch is one canonical one, within the budget."""
    hosted, g, size = step.shape
    k = hosted // ranks_per_node
    if not balanced:
        mine = step.reshape(ranks_per_node, k, g, size).transpose(0, 2, 1, 3)
        return mine.reshape(ranks_per_node, k * g, size)
    packs = step.transpose(1, 0, 2).reshape(-1, size)  # micro-batch t of every hosted rank
    real = packs >= 0  # the tokens contract pads micro-batches with -1
    ids = np.where(real, packs, 0).ravel()
    record = np.asarray(costs[ids], dtype=np.float64).reshape(packs.shape)
    cost = np.where(real, record, 0.0).sum(axis=1)
    rounds = np.argsort(-cost, kind="stable").reshape(k * g, ranks_per_node)
    rounds[1::2] = rounds[1::2, ::-1]  # snake: the lightest of a round meets the heaviest next
    return packs[rounds.T]


def physical_packs(
    packs: npt.NDArray[np.int64],
    costs: Any,
    ranks: int,
    ranks_per_node: int,
    canonical_per_node: int,
    grad_accum: int,
    balanced: bool = True,
    hosting: str = "strided",
) -> npt.NDArray[np.int64]:
    """A whole canonical plan's packs (V, n, B) as ``ranks`` physical ranks run them:
    (R, n*V/R, B); ``grad_accum`` is a canonical rank's G_c (the last step may be short)."""
    v, n, size = packs.shape
    k = v // ranks
    out = np.empty((ranks, n * k, size), dtype=np.int64)
    for node in range(ranks // ranks_per_node):
        hosted = node_hosts(v, canonical_per_node, ranks, ranks_per_node, node, hosting)
        first = node * ranks_per_node
        for s in range(0, n, grad_accum):
            g = min(grad_accum, n - s)
            dealt = deal_step(packs[hosted, s : s + g], costs, ranks_per_node, balanced)
            out[first : first + ranks_per_node, s * k : (s + g) * k] = dealt
    return out
