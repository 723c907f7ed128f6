"""Canonical ranks under the token contract (``epoch/canonical.py``, ``contract="tokens"``):
the plan fixes V canonical ranks' micro-batches of at most T tokens; R physical ranks (R | V)
each run V/R canonical ranks' micro-batches per micro-batch index, whole, so every physical
micro-batch is one canonical one (the budget T per physical rank holds) and every physical
rank runs G_c*V/R of them per step (equal counts). Tested at R = V, V/2, V/4, 1: the same
micro-batches per optimizer step, the budget, equal counts, every record once, and a cursor
resuming across R (pure, no I/O; the reader's walk from any start: ``test_canonical.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pack_oracles import check_every_record_once, micro_batches
from shard_tables import lognormal_index

from bcl_stream.epoch.canonical import canonical_plan
from bcl_stream.epoch.cursor import Cursor, resolve_state
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig, reader_plan
from bcl_stream.io.index import CostIndex
from bcl_stream.planner.token_contract import EMPTY

V, T = 8, 2048


def make_index(n: int = 6000, shard: int = 200, seed: int = 0) -> CostIndex:
    return lognormal_index(n, shard, seed, mu=4.5, cap=1800)


INDEX = make_index()
TOKENS = np.asarray(INDEX.tokens[:], dtype=np.int64)


def config(r: int, **knobs: object) -> ReaderConfig:
    fields: dict[str, object] = {
        "window": 4, "scope": "world", "grad_accum": 2, "seed": 3, "contract": "tokens",
        "max_tokens": T, "canonical_ranks": V, "canonical_ranks_per_node": 4,
        "ranks_per_node": min(r, 4),
    }  # fmt: skip
    fields.update(knobs)
    return ReaderConfig.build(world_size=r, **fields)  # type: ignore[arg-type]


def steps_of(packs: np.ndarray, per_step: int) -> list[list[tuple[int, ...]]]:
    """(R, n, width) physical micro-batches -> per optimizer step, the sorted set of its
    micro-batches (each a tuple of its record ids, padding dropped)."""
    return [
        sorted(micro_batches(packs[:, s : s + per_step]))
        for s in range(0, packs.shape[1], per_step)
    ]


def check_budget(packs: np.ndarray, layout: str) -> None:
    real = packs != EMPTY
    tok = np.where(real, TOKENS[np.where(real, packs, 0)], 0)
    rows = real.sum(axis=2)
    assert rows.min() >= 1  # no empty micro-batch
    used = rows * tok.max(axis=2) if layout == "padded" else tok.sum(axis=2)
    assert used.max() <= T


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_steps_are_the_plan_for_v_ranks_at_every_size(scope: str, layout: str) -> None:
    g = 2
    plain = ReaderConfig.build(
        world_size=V, ranks_per_node=4, window=4, scope=scope, grad_accum=g, seed=3,
        contract="tokens", max_tokens=T, layout=layout,
    )  # fmt: skip
    oracle = full_plan(INDEX, plain, 0)
    want = steps_of(oracle.plan.packs, g)
    for r, per_node in ((V, 4), (V // 2, 4), (V // 2, 2), (V // 4, 1), (1, 1)):
        cfg = config(r, scope=scope, layout=layout, ranks_per_node=per_node)
        got = full_plan(INDEX, cfg, 0).plan.packs
        # equal counts: every physical rank V/R canonical ranks' micro-batches
        assert got.shape[:2] == (r, oracle.plan.packs.shape[1] * V // r)
        assert got.shape[1] % cfg.micro_batches_per_step == 0  # whole steps
        check_budget(got, layout)
        assert steps_of(got, g * V // r) == want, f"R={r}"
        check_every_record_once(got[got != EMPTY], oracle.plan.packs[oracle.plan.packs != EMPTY])
        plan = canonical_plan(INDEX, cfg, 0)
        assert plan.n_packs == got.shape[1]
        assert full_plan(INDEX, cfg, 0).remainder_counts() == oracle.remainder_counts()
        assert plan.remainder_counts() == reader_plan(INDEX, plain, 0).remainder_counts()
        for s in (0, plan.n_steps - 1):
            assert sorted(micro_batches(plan.step_packs(s))) == want[s]


def test_every_record_once_or_reported() -> None:
    cfg = config(2, ranks_per_node=2)
    plan = full_plan(INDEX, cfg, 0)
    packs = plan.plan.packs
    check_every_record_once(packs[packs != EMPTY], len(INDEX), plan.plan.remainder)


def test_cursor_counts_steps_and_resumes_at_the_same_step_on_any_size() -> None:
    state = json.loads(json.dumps(Cursor(0, 3 * 8, INDEX.fingerprint(), config(2)).to_dict()))
    assert (state["canonical_steps"], state["step_micro_batches"]) == (3, 0)
    assert state["config"]["plan"]["contract"] == "tokens"
    for r in (8, 4, 2, 1):
        cursor = resolve_state(state, fingerprint=INDEX.fingerprint(), config=config(r))
        assert cursor.packs_consumed == 3 * 2 * V // r
        whole = full_plan(INDEX, config(r), 0).plan.packs
        plan = canonical_plan(INDEX, config(r), 0)
        got = [
            b
            for _, p in plan.iter_rank_packs(r - 1, cursor.packs_consumed)
            for b in micro_batches(p)
        ]
        assert got == micro_batches(whole[r - 1, cursor.packs_consumed :])


def test_the_step_contract_is_still_refused() -> None:
    with pytest.raises(ValueError, match="contract='pack' or 'tokens'"):
        config(2, contract="step", layout="padded", max_tokens=None, pack_size=4)


def test_the_simulator_runs_the_readers_physical_micro_micro_batches() -> None:
    """``simulate --canonical-ranks`` under the token contract scores what the readers run:
    each physical micro-batch one canonical micro-batch, G_c*V/R per rank and step."""
    from bcl_stream.analysis.sim import SimConfig, plan_schedules, shard_table

    tok = TOKENS
    costs = np.asarray(INDEX.costs())
    sim = SimConfig(
        ranks=4, ranks_per_node=2, grad_accum=4, contract="tokens", max_tokens=T, window=4,
        canonical_ranks=V, canonical_ranks_per_node=4, shard_records=200, seed=3,
    )  # fmt: skip
    s = plan_schedules(tok, costs, shard_table(tok, costs, 200), sim, ("bcl-world",))["bcl-world"]
    assert len({len(rank) for rank in s.packs}) == 1  # equal counts
    assert all(int(tok[p].sum()) <= T for rank in s.packs for p in rank)
    got = [tuple(p.tolist()) for rank in s.packs for p in rank]
    cfg = config(4, ranks_per_node=2)
    whole = full_plan(INDEX, cfg, 0).plan.packs
    assert sorted(got) == sorted(micro_batches(whole))
