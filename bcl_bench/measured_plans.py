"""What ``tools/bench_measured.py`` times: every strategy's packs, every contract's micro-batches
and the probe packs that separate a per-micro-batch price from a per-record one.

Why here and not in the tool: the tool measures and reports; what is measured must be the
same plans the simulator scores (the peers through ``bcl_stream.peers``, BCL through the
planner itself), built in one place that a test can read.

Contracts are a parameter (``--contracts``): each name is planned by BCL (scope ``world``) with
that record contract at the *same peak tokens* (the most tokens in any micro-batch under the
``pack`` contract, passed to the others as their memory cap), so a difference in measured time
is the contract's, not a larger memory budget's. A contract the planner does not know yet
(``PlanConfig.contract`` accepts :data:`bcl_stream.planner.contracts.CONTRACTS`) is reported
as not yet available, with the planner's list, instead of being skipped silently or faked.
A budget contract (``tokens``) is planned by ``plan_epoch`` as the reader plans it (its own
record geometry, :func:`bcl_stream.planner.token_contract.token_geometry`, and the token
walker); what its
micro-batches do not hold (the epoch's tail, records over the budget) is counted by reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.sim import default_capacity
from bcl_stream.cost import CostModel
from bcl_stream.peers import REAL_PEERS, Pool, global_order, plan_pooled
from bcl_stream.planner import Plan, PlanConfig, ShardTable, plan_epoch, shard_weights
from bcl_stream.planner.contracts import CONTRACTS
from bcl_stream.planner.step_contract import node_micro_batches
from bcl_stream.planner.token_contract import (
    unpad,
)

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


MicroBatches = Callable[
    [Plan, npt.NDArray[np.float64], npt.NDArray[np.int64], Setting, str, int], Packs
]
"""How a contract's micro-batches are read off a plan: (plan, costs, tokens of the measured
records, setting, layout, peak tokens) -> ``[rank][micro-batch]`` local record ids."""


def _pack_micro_batches(
    plan: Plan, costs: Any, tokens: Any, setting: Setting, layout: str, peak: int
) -> Packs:
    return [list(rank) for rank in plan.packs]


def _step_micro_batches(
    plan: Plan, costs: Any, tokens: Any, setting: Setting, layout: str, peak: int
) -> Packs:
    # one node holds all R ranks here, so they share one stream (scope world): group = R
    return node_micro_batches(
        plan.packs, costs, setting.grad_accum, layout, setting.ranks, tokens, peak
    )


def _token_micro_batches(
    plan: Plan, costs: Any, tokens: Any, setting: Setting, layout: str, peak: int
) -> Packs:
    # the plan pads each micro-batch with EMPTY (-1) to the widest: strip it as readers do
    return [[unpad(row) for row in rank] for rank in plan.packs]


MICRO_BATCHES: dict[str, MicroBatches] = {
    "pack": _pack_micro_batches,
    "step": _step_micro_batches,
    "tokens": _token_micro_batches,
}
"""The contracts this benchmark can run: one entry per record contract. A new contract of the
planner (``PlanConfig.contract``) is measured once it has an entry here."""


def plan_contracts(
    tokens: npt.NDArray[np.int64],
    model: CostModel,
    setting: Setting,
    contracts: tuple[str, ...],
    layout: str = "packed",
) -> dict[str, dict[str, Any]]:
    """BCL (scope ``world``, ``model``'s costs) under every contract in ``contracts``, all at the
    peak tokens of the ``pack`` contract (always planned: it sets the cap). Each entry:
    ``status`` (``planned`` or ``not yet available``, with ``why``), and when planned
    ``micro_batches`` (a :data:`Packs`), ``peak_tokens``, ``max_tokens`` (the cap it was
    planned under), ``records`` (held by the micro-batches) and what the plan left out by
    reason (``remainder``: counts, ``remainder_ids``: global ids). Held plus left out must be
    the measured set, or it raises: a contract is never timed on fewer records unseen."""
    order = measured_order(tokens.size, setting)
    sub = tokens[order]
    costs = model.cost(sub)
    world = dataclasses.replace(_plan_config(setting), scope="world", layout=layout)
    out: dict[str, dict[str, Any]] = {}
    peak = 0
    for name in dict.fromkeys(("pack", *contracts)):
        if name not in CONTRACTS or name not in MICRO_BATCHES:
            why = (
                f"the planner's record contracts are {list(CONTRACTS)}; {name!r} is not one "
                "of them yet"
                if name not in CONTRACTS
                else f"the planner has {name!r} but this benchmark does not read its "
                "micro-batches yet (bcl_bench/measured_plans.py: MICRO_BATCHES)"
            )
            out[name] = {"status": "not yet available", "why": why}
            continue
        cap = None if name == "pack" else peak
        config = dataclasses.replace(world, contract=name, max_tokens=cap)
        plan = plan_epoch(costs, _table(costs), config, seed=setting.seed, tokens=sub)
        local = MICRO_BATCHES[name](plan, costs, sub, setting, layout, peak)
        mbs = [[order[np.asarray(mb, dtype=np.int64)] for mb in rank] for rank in local]
        if name == "pack":
            peak = peak_tokens(mbs, tokens)
        held = sum(mb.size for rank in mbs for mb in rank)
        out[name] = {
            "status": "planned",
            "micro_batches": mbs,
            "peak_tokens": peak_tokens(mbs, tokens),
            "max_tokens": cap,
            "records": held,
            "remainder": plan.remainder_counts(),
            "remainder_ids": {r: order[ids] for r, ids in plan.remainder.items() if ids.size},
        }
        if held + plan.records_left != sub.size:
            raise RuntimeError(
                f"contract {name!r}: {held} records in micro-batches and {plan.records_left} "
                f"reported, the measured set holds {sub.size}"
            )
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
