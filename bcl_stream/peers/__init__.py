"""The systems BCL is measured against, reproduced, behind one registry (:data:`PEERS`).

Each peer is a pure function (numpy only, like the planner, whose modules it may import but
which never imports it) from a :class:`~bcl_stream.peers.pools.Pool` (the order a central
driver reads, tokens by record id, R, B, G) and the token capacity M to ``[rank][micro-batch]``
arrays of record ids plus ``{"epoch_tail": ids}``; every rank gets the same number of
micro-batches. One module per system: ``nemo.py``, ``verl.py``, ``hf.py``, ``multipack.py``, ``trl.py`` (each names the
upstream revision or release it follows and the files it was read from), ``mffd.py`` (a
textbook packer no system ships); ``pools.py`` holds the shared input and the central sampler's
order (:func:`~bcl_stream.peers.pools.global_order`).

The ``sequential`` baseline is not here: it is BCL's own planner with balancing switched off
(``bcl_stream.planner.plan_epoch(..., balanced=False)``, ``PlanConfig.unbalanced``), reading the
same node streams as BCL, so the two differ only in the packing.

The simulator (``bcl_stream.analysis.sim``), the benchmarks and the tests take the strategy
names, the planning functions and the set of real peers from :data:`PEERS` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bcl_stream.peers.hf import TRANSFORMERS_VERSION, hf_rebalance
from bcl_stream.peers.mffd import pooled_mffd_split
from bcl_stream.peers.multipack import MULTIPACK_REVISION, multipack
from bcl_stream.peers.nemo import NEMO_RL_REVISION, nemo_mffd
from bcl_stream.peers.pools import Bins, Pool, Remainder, global_order, micro_batches_per_batch
from bcl_stream.peers.trl import TRL_REVISION, trl_token_budget
from bcl_stream.peers.verl import VERL_REVISION, verl_dynbsz, verl_kk

PooledPlanner = Callable[[Pool, int], tuple[Bins, Remainder]]
"""(pool, capacity M) -> (bins per rank, remainder)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """One strategy BCL is compared with: how to plan it and what it reproduces."""

    name: str
    """The strategy name (``bcl-stream simulate --strategies``, result tables)."""
    plan: PooledPlanner
    reproduces: str
    """The system and the setting of it that is reproduced."""
    follows: str
    """The upstream code it was re-implemented from: repository, revision or release, files."""
    keeps_contract: bool = False
    """Whether every micro-batch holds exactly B records (the record-count contract)."""
    capacity: str | None = None
    """What the token capacity M is to it (bin capacity, token budget); None: unused."""
    real: bool = False
    """Whether users run it today: speedups are reported against the real peers."""
    pooled: bool = True
    """Plans global batches of R*B*G records (a central driver's); False: the whole epoch's
    order at once, G consecutive micro-batches a step (``multipack``)."""
    communication: str = "a central driver ships each rank its share"
    """What keeps the ranks' micro-batch counts equal."""


def _without_capacity(planner: Callable[[Pool], tuple[Bins, Remainder]]) -> PooledPlanner:
    def plan(pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
        del capacity  # the peer has no token cap
        return planner(pool)

    plan.__name__ = plan.__qualname__ = planner.__name__
    return plan


_VERL_FILES = "verl/utils/seqlen_balancing.py, verl/trainer/ppo/ray_trainer.py"

PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            name="nemo_mffd",
            plan=nemo_mffd,
            reproduces="NeMo-RL sequence packing (the policy's training shard of a global "
            "batch, microbatch_order: packer)",
            follows=f"NVIDIA-NeMo/RL {NEMO_RL_REVISION}: nemo_rl/data/packing/algorithms.py, "
            "nemo_rl/distributed/batched_data_dict.py",
            capacity="bin capacity (train_mb_tokens)",
            real=True,
        ),
        Peer(
            name="verl_kk",
            plan=_without_capacity(verl_kk),
            reproduces="verl balance_batch with a fixed micro-batch of B records",
            follows=f"verl-project/verl {VERL_REVISION}: {_VERL_FILES}",
            keeps_contract=True,
            real=True,
        ),
        Peer(
            name="verl_dynbsz",
            plan=verl_dynbsz,
            reproduces="verl balance_batch, then use_dynamic_bsz micro-batches",
            follows=f"verl-project/verl {VERL_REVISION}: {_VERL_FILES}, "
            "verl/workers/engine/utils.py",
            capacity="token budget (ppo_max_token_len_per_gpu)",
            communication="a central driver, then an all-reduce (max) of the micro-batch "
            "count: lighter ranks split into as many",
        ),
        Peer(
            name="pooled_mffd_split",
            plan=pooled_mffd_split,
            reproduces="no system: a textbook MFFD central packer, stronger than any peer ships",
            follows="Johnson & Garey (1985) Modified First Fit Decreasing; fullest bins split "
            "in halves until the count is a multiple of R",
            capacity="bin capacity",
        ),
        Peer(
            name="hf_rebalance",
            plan=_without_capacity(hf_rebalance),
            reproduces="Transformers Trainer, train_sampling_strategy='batch_rebalance' "
            "(R*B*G records per optimizer step, micro-batch sizes vary)",
            follows=f"huggingface/transformers {TRANSFORMERS_VERSION}: "
            "transformers/trainer_pt_utils.py (BatchRebalanceSampler)",
            real=True,
            communication="none: every rank plans the same global batch from a shared seed",
        ),
        Peer(
            name="multipack",
            plan=multipack,
            reproduces="the multipack sampler (MultipackDistributedBatchSampler; axolotl's "
            "MultipackBatchSampler grew from it): FFD on token counts, one bin per rank",
            follows=f"imoneoi/multipack_sampler {MULTIPACK_REVISION}: multipack_sampler.py",
            capacity="bin capacity (batch_max_length)",
            pooled=False,
            communication="none: every rank computes the same allocation from a shared seed",
        ),
        Peer(
            name="trl_token_budget",
            plan=trl_token_budget,
            reproduces="TRL's TokenBudgetBatcher (AsyncGRPOTrainer, token_budget > 0): each "
            "sample in arrival order into the open row with the least sum L^2 that has room",
            follows=f"huggingface/trl {TRL_REVISION}: "
            "trl/experimental/async_grpo/async_grpo_trainer.py",
            capacity="token budget (token_budget)",
            pooled=False,
            communication="a central planner: the main process plans every micro-batch and "
            "accelerate's DataLoaderDispatcher scatters row r to rank r",
        ),
    )
}
"""Every peer by name, in the order result tables list them."""

REAL_PEERS = tuple(name for name, peer in PEERS.items() if peer.real)
"""The peers speedups are reported against: what NeMo-RL, verl and Hugging Face Trainer users
run today."""

RENAMED = {"pooled_mffd": "pooled_mffd_split: a textbook MFFD; NeMo-RL's own is nemo_mffd"}
"""Former strategy names, with what to use instead."""


def rename_hint(name: str) -> str:
    """`` (renamed ...)`` for a former strategy name, else empty: for "unknown name" errors."""
    return f" (renamed {RENAMED[name]})" if name in RENAMED else ""


def plan_pooled(name: str, pool: Pool, capacity: int) -> tuple[Bins, Remainder]:
    """Plan ``pool`` with the peer ``name`` (a key of :data:`PEERS`) at token capacity M."""
    if name not in PEERS:
        raise ValueError(
            f"unknown pooled strategy {name!r}{rename_hint(name)}; choose from {tuple(PEERS)}"
        )
    return PEERS[name].plan(pool, capacity)


__all__ = [
    "PEERS",
    "REAL_PEERS",
    "Bins",
    "Peer",
    "Pool",
    "PooledPlanner",
    "Remainder",
    "global_order",
    "micro_batches_per_batch",
    "plan_pooled",
    "rename_hint",
]
