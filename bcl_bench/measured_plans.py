"""What ``tools/bench_measured.py`` times: every strategy's packs, every contract's micro-batches
and the probe packs that separate a per-micro-batch price from a per-record one.

Why here and not in the tool: the tool measures and reports; what is measured must be the
same plans the simulator scores (the peers through ``bcl_stream.peers``, BCL through the
planner itself), built in one place that a test can read.

Contracts are a parameter (``--contracts``): each name is planned by BCL (scope ``world``) with
that record contract at the *same peak tokens* (the most tokens in any micro-batch under the
``pack`` contract, passed to the others as their memory cap), so a difference in measured time
is the contract's, not a larger memory budget's. A contract the planner does not know yet
(``PlanConfig.contract`` accepts :data:`bcl_stream.planner.step_contract.CONTRACTS`) is reported
as not yet available, with the planner's list, instead of being skipped silently or faked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.sim import default_capacity
from bcl_stream.cost import CostModel
from bcl_stream.peers import REAL_PEERS, Pool, global_order, plan_pooled
from bcl_stream.planner import PlanConfig, ShardTable, plan_epoch, shard_weights
from bcl_stream.planner.step_contract import CONTRACTS, node_micro_batches

Packs = list[list[npt.NDArray[np.int64]]]
"""[rank][step] -> record ids (global ids into the corpus' token counts)."""

PEER_HOWS = {
    "nemo_mffd": "tokens (NeMo-RL MFFD bins)",
    "verl_kk": "verl workload (KK)",
    "hf_rebalance": "lengths, padded cost (Transformers)",
}

PROBE_COUNTS = (1, 2, 4, 8, 16, 32)
"""Records per probe pack: the same tokens cut into more records, so the per-record and the
per-micro-batch price separate in the overhead fit even where every planned pack holds B."""
PROBE_TOTALS = (64, 256, 1024)
"""Tokens per probe pack."""


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """The measured epoch: R ranks, B records per pack, W packs per window, ``steps`` packs per
    rank, the peers' G, and the planning seed."""

    ranks: int
    pack_size: int
    window: int
    steps: int
    grad_accum: int
    seed: int

    @property
    def records(self) -> int:
        return self.ranks * self.steps * self.pack_size


def measured_order(n_records: int, setting: Setting) -> npt.NDArray[np.int64]:
    """The records measured: the first R*steps*B of the seeded epoch order."""
    if n_records < setting.records:
        raise ValueError(
            f"the corpus holds {n_records} records, the setting needs {setting.records} "
            f"({setting.ranks} ranks x {setting.steps} steps x {setting.pack_size}): "
            "lower --packs-per-rank or --ranks"
        )
    return global_order(n_records, setting.seed, 0)[: setting.records]


def _plan_config(setting: Setting) -> PlanConfig:
    return PlanConfig(
        world_size=setting.ranks, ranks_per_node=setting.ranks, pack_size=setting.pack_size,
        window=setting.window, grad_accum=setting.grad_accum,
    )  # fmt: skip


def _table(sub_costs: npt.NDArray[np.float64]) -> ShardTable:
    return ShardTable.build([sub_costs.size], weight=shard_weights([sub_costs.size], sub_costs))


def plan_strategies(
    tokens: npt.NDArray[np.int64], models: dict[str, CostModel], setting: Setting
) -> tuple[dict[str, Packs], dict[str, str]]:
    """Every strategy's packs on the same records: ``sequential``, the real peers, and BCL
    (scopes ``rank`` and ``world``) under each cost model (``calibrated`` unsuffixed)."""
    order = measured_order(tokens.size, setting)
    sub = tokens[order]  # the records measured, as one shard; plans map back through ``order``
    config = _plan_config(setting)
    out: dict[str, Packs] = {}
    planned_with: dict[str, str] = {}
    sub_costs = sub.astype(np.float64)
    seq = plan_epoch(sub_costs, _table(sub_costs), config, seed=setting.seed, balanced=False)
    out["sequential"] = [list(rank) for rank in order[seq.packs]]
    planned_with["sequential"] = "none"
    capacity = default_capacity(sub, setting.pack_size)
    for peer in REAL_PEERS:
        pool = Pool(order, tokens, setting.ranks, setting.pack_size, setting.grad_accum)
        bins, _ = plan_pooled(peer, pool, capacity)
        out[peer] = [list(rank) for rank in bins]
        planned_with[peer] = PEER_HOWS.get(peer, peer)
    for label, model in models.items():
        costs = model.cost(sub)
        for scope in ("rank", "world"):
            scoped = dataclasses.replace(config, scope=scope)
            plan = plan_epoch(costs, _table(costs), scoped, seed=setting.seed, tokens=sub)
            name = f"bcl-{scope}" if label == "calibrated" else f"bcl-{scope}:{label}"
            out[name] = [list(rank) for rank in order[plan.packs]]
            planned_with[name] = label
    return out, planned_with


def peak_tokens(packs: Packs, tokens: npt.NDArray[np.int64]) -> int:
    """The most tokens any micro-batch of ``packs`` holds: the memory a contract needs."""
    return max(int(tokens[p].sum()) for rank in packs for p in rank)


def plan_contracts(
    tokens: npt.NDArray[np.int64],
    model: CostModel,
    setting: Setting,
    contracts: tuple[str, ...],
    layout: str = "packed",
) -> dict[str, dict[str, Any]]:
    """BCL (scope ``world``, ``model``'s costs) under every contract in ``contracts``, all at the
    peak tokens of the ``pack`` contract (always planned: it sets the cap). Each entry:
    ``status`` (``planned`` or ``not yet available``), and when planned ``micro_batches`` (a
    :data:`Packs`), ``peak_tokens`` and ``max_tokens`` (the cap it was planned under)."""
    order = measured_order(tokens.size, setting)
    sub = tokens[order]
    costs = model.cost(sub)
    world = dataclasses.replace(_plan_config(setting), scope="world", layout=layout)
    base = plan_epoch(costs, _table(costs), world, seed=setting.seed, tokens=sub)
    pack_mbs: Packs = [list(rank) for rank in order[base.packs]]
    peak = peak_tokens(pack_mbs, tokens)
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(("pack", *contracts)):
        if name not in CONTRACTS:
            out[name] = {
                "status": "not yet available",
                "why": f"the planner's record contracts are {list(CONTRACTS)}; "
                f"{name!r} is not one of them yet",
            }
            continue
        if name == "pack":
            mbs = pack_mbs
        else:
            config = dataclasses.replace(world, contract=name, max_tokens=peak)
            plan = plan_epoch(costs, _table(costs), config, seed=setting.seed, tokens=sub)
            local = node_micro_batches(
                plan.packs, costs, setting.grad_accum, layout, setting.ranks, sub, peak
            )
            mbs = [[order[np.asarray(mb, dtype=np.int64)] for mb in rank] for rank in local]
        out[name] = {
            "status": "planned",
            "micro_batches": mbs,
            "peak_tokens": peak_tokens(mbs, tokens),
            "max_tokens": None if name == "pack" else peak,
        }
    return out


def probe_packs(max_tokens: int) -> list[npt.NDArray[np.int64]]:
    """Token counts of the probe packs: for every total in :data:`PROBE_TOTALS` (at most
    ``max_tokens``) and count in :data:`PROBE_COUNTS`, ``count`` equal records of that total
    (counts above the total are left out: a record holds at least one token)."""
    out = []
    for total in (t for t in PROBE_TOTALS if t <= max_tokens):
        for count in (c for c in PROBE_COUNTS if c <= total):
            out.append(np.full(count, total // count, dtype=np.int64))
    return out
