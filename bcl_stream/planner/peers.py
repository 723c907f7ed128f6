"""The pooled strategies BCL is measured against, by name, behind one signature.

Each takes a :class:`~bcl_stream.planner.pools.Pool` (the order a driver reads, tokens by
record id, R, B, G) and the token capacity M, pools global batches of R*B*G records and returns ``[rank][micro-batch]`` arrays of
record ids plus ``{"epoch_tail": ids}``. Every rank gets the same number of micro-batches.

| name | reproduces | records per micro-batch | uses M as |
|---|---|---|---|
| ``nemo_mffd`` | NeMo-RL sequence packing (``nemo.py``) | varies (contract broken) | bin capacity |
| ``verl_kk`` | verl ``balance_batch`` (``verl.py``) | exactly B (contract kept) | unused |
| ``verl_dynbsz`` | verl dynamic batch size (``verl.py``) | varies (contract broken) | token budget |
| ``hf_rebalance`` | Transformers ``BatchRebalanceSampler`` (``hf.py``) | varies; R*B*G per step | unused |
| ``pooled_mffd_split`` | no system: a textbook MFFD (``baselines.py``) | varies | bin capacity |
"""

from __future__ import annotations

from collections.abc import Callable

from bcl_stream.planner.baselines import pooled_mffd_split
from bcl_stream.planner.hf import hf_rebalance
from bcl_stream.planner.nemo import nemo_mffd
from bcl_stream.planner.pools import Bins, Pool, Remainder
from bcl_stream.planner.verl import verl_dynbsz, verl_kk

PooledPlanner = Callable[[Pool, int], tuple[Bins, Remainder]]
"""(pool, capacity M) -> (bins per rank, remainder)."""

POOLED: dict[str, PooledPlanner] = {
    "nemo_mffd": nemo_mffd,
    "verl_kk": lambda pool, _capacity: verl_kk(pool),
    "verl_dynbsz": verl_dynbsz,
    "pooled_mffd_split": pooled_mffd_split,
    "hf_rebalance": lambda pool, _capacity: hf_rebalance(pool),
}
REAL_PEERS = ("nemo_mffd", "verl_kk", "hf_rebalance")
"""The peers speedups are reported against: what NeMo-RL, verl and Hugging Face Trainer users
run today."""


def plan_pooled(name: str, pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """Run the pooled strategy ``name`` (a key of :data:`POOLED`)."""
    if name not in POOLED:
        raise ValueError(f"unknown pooled strategy {name!r}; choose from {tuple(POOLED)}")
    return POOLED[name](pool, capacity)
