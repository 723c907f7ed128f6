"""The ``step`` record contract: a step's records re-cut into micro-batches of varying size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once

from bcl_stream.analysis.sim import SimConfig, schedules, simulate
from bcl_stream.cost import get_preset
from bcl_stream.epoch.steps import whole_steps
from bcl_stream.planner.padded import pack_cost
from bcl_stream.planner.step_contract import deal_step, node_micro_batches, recut_step


@settings(max_examples=80, deadline=None)
@given(
    g=st.integers(1, 6),
    b=st.integers(1, 8),
    layout=st.sampled_from(["packed", "padded"]),
    seed=st.integers(0, 2**16),
)
def test_a_step_is_re_cut_into_g_micro_batches_of_its_own_records(
    g: int, b: int, layout: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    costs = np.round(rng.lognormal(3, 1.2, g * b), 1)
    positions, sizes = recut_step(costs, g, layout)
    check_every_record_once(positions, g * b)
    assert sizes.size == g and sizes.min() >= 1 and sizes.sum() == g * b
    parts = np.split(costs[positions], np.cumsum(sizes)[:-1])
    cut = [float(pack_cost(p, layout)) for p in parts]
    assert cut == sorted(cut, reverse=True)  # costliest micro-batch first
    # The sorted chunks of exactly B are one contiguous cut: the re-cut never does worse.
    chunks = np.sort(costs)[::-1].reshape(g, b)
    assert max(cut) <= float(pack_cost(chunks, layout).max()) * (1 + 1e-6)
    if layout == "padded":  # and for padded, no worse than any split into packs of B
        assert max(cut) <= float(pack_cost(costs.reshape(g, b), layout).max()) * (1 + 1e-6)


def test_padded_gives_long_records_small_micro_batches() -> None:
    # One record of cost 100 and seven of 10, two micro-batches: padded costs 1 x 100 and
    # 7 x 10 (B=4 would cost 4 x 100 and 4 x 10).
    costs = np.array([10.0, 10, 100, 10, 10, 10, 10, 10])
    positions, sizes = recut_step(costs, 2, "padded")
    assert sizes.tolist() == [1, 7] and positions[0] == 2


def test_the_memory_cap_bounds_every_micro_batch_or_keeps_the_packs() -> None:
    costs = np.array([100.0, 10, 10, 10, 10, 10, 10, 10])
    tokens = np.array([100, 10, 10, 10, 10, 10, 10, 10])
    _, sizes = recut_step(costs, 2, "padded", tokens, max_tokens=40)
    assert sizes.tolist() == [4, 4]  # a 100-token record over a cap of 40: the packs are kept
    _, sizes = recut_step(costs, 2, "padded", tokens, max_tokens=100)
    assert sizes.tolist() == [1, 7]
    with pytest.raises(ValueError, match="needs the records' tokens"):
        recut_step(costs, 2, "padded", max_tokens=10)
    with pytest.raises(ValueError, match="micro-batches <= records"):
        recut_step(costs, 9, "padded")


def test_a_short_last_step_keeps_its_pack_count() -> None:
    packs = np.arange(5 * 3).reshape(5, 3)  # G=2: steps of 2, 2 and 1 packs
    costs = np.linspace(1, 3, 15)
    out = node_micro_batches(packs[None], costs, 2, "padded", 1)[0]
    assert len(out) == 5
    check_every_record_once(out[4:], [12, 13, 14])
    check_every_record_once(out[:2], 6)


def test_a_node_step_is_dealt_in_snake_order_of_cost() -> None:
    costs = np.array([8.0, 1, 7, 2, 6, 3, 5, 4])
    step = np.arange(8).reshape(2, 2, 2)  # 2 ranks, 2 packs of 2
    # By cost: 0 (8), 2 (7), 4 (6), 6 (5), 7 (4), 5 (3), 3 (2), 1 (1) -> ranks 0,1,1,0,0,1,1,0.
    assert deal_step(step, costs).tolist() == [[0, 6, 7, 1], [2, 4, 5, 3]]
    packed = node_micro_batches(step, costs, 2, "packed", 2)  # packed: the planner's packs
    assert [[mb.tolist() for mb in rank] for rank in packed] == step.tolist()


def test_whole_steps_regroups_batches_on_step_boundaries() -> None:
    packs = np.arange(11)[None, :, None]  # one rank's group, 11 packs of 1
    batches = iter([(0, packs[:, :4]), (4, packs[:, 4:5]), (5, packs[:, 5:11])])
    got = list(whole_steps(batches, 3))
    assert [first for first, _ in got] == [0, 3, 9]
    assert [p.ravel().tolist() for _, p in got] == [[0, 1, 2], [3, 4, 5, 6, 7, 8], [9, 10]]


def test_simulated_step_contract_keeps_g_times_b_per_rank_and_step() -> None:
    rng = np.random.default_rng(3)
    tok = np.clip(rng.lognormal(5.5, 1.0, 3000).astype(np.int64), 1, 4096)
    model = get_preset("llama3-8b")
    config = SimConfig(ranks=4, ranks_per_node=4, pack_size=4, grad_accum=4, window=8,
                       layout="padded", contract="step", shard_records=512)  # fmt: skip
    planned = schedules(tok, model, config, ("bcl-rank", "bcl-world"))
    plain = schedules(tok, model, _pack(config), ("bcl-rank", "bcl-world"))
    for name, s in planned.items():
        base = np.asarray(plain[name].packs)
        for r, rank in enumerate(s.packs):
            assert len(rank) == base.shape[1]
            assert len({mb.size for mb in rank}) > 1  # sizes do vary
            for k in range(0, len(rank), 4):
                step = np.concatenate(rank[k : k + 4]).tolist()
                assert len(step) == min(4, len(rank) - k) * 4  # G*B records per step
                if name == "bcl-rank":  # its own records; node/world: dealt within the node
                    check_every_record_once(step, base[r, k : k + 4], what=f"{name} r{r}")
        for k in range(0, base.shape[1], 4):  # the node's step holds the plan's records
            step = [i for rank in s.packs for mb in rank[k : k + 4] for i in mb.tolist()]
            check_every_record_once(step, base[:, k : k + 4], what=f"{name} step {k // 4}")
    scored, before = simulate(tok, model, config), simulate(tok, model, _pack(config))
    for name in ("bcl-rank", "bcl-world"):  # the padded layout gains from varying sizes
        assert scored[name].time < before[name].time


def _pack(config: SimConfig) -> SimConfig:
    return dataclasses.replace(config, contract="pack")
