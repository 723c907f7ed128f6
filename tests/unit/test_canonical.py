"""Canonical ranks: the optimizer steps of a plan for V canonical ranks at R = V, V/2, V/4 (pure,
no I/O): the same packs per step, every record once, resume across sizes, refusals named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pack_oracles import check_every_record_once, check_walks_from_any_start
from shard_tables import lognormal_index

from bcl_stream.cost import get_preset
from bcl_stream.epoch.canonical import canonical_plan
from bcl_stream.epoch.cursor import Cursor, parse_state, resolve_state
from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import StateError
from bcl_stream.io.index import CostIndex, ShardEntry

V = 8


def make_index(n: int = 3000, shard: int = 100, seed: int = 0) -> CostIndex:
    return lognormal_index(n, shard, seed, mu=4, cap=4000)


INDEX = make_index()


def config(r: int, **knobs: object) -> ReaderConfig:
    fields: dict[str, object] = {
        "pack_size": 4, "window": 4, "scope": "world", "grad_accum": 2, "seed": 3,
        "canonical_ranks": V, "canonical_ranks_per_node": 4, "ranks_per_node": min(r, 4),
    }  # fmt: skip
    fields.update(knobs)
    return ReaderConfig.build(world_size=r, **fields)  # type: ignore[arg-type]


def steps_of(packs: np.ndarray, per_step: int) -> list[list[tuple[int, ...]]]:
    """(R, n, B) physical micro-batches -> per optimizer step, the sorted set of its packs."""
    n = packs.shape[1]
    return [
        sorted(map(tuple, packs[:, s : s + per_step].reshape(-1, packs.shape[2]).tolist()))
        for s in range(0, n, per_step)
    ]


@pytest.mark.parametrize("scope", ["rank", "node", "world"])
@pytest.mark.parametrize("grad_accum", [1, 3])
@pytest.mark.parametrize("packing", ["bcl", "sequential"])
def test_steps_are_the_plan_for_v_ranks_at_every_size(
    scope: str, grad_accum: int, packing: str
) -> None:
    # The oracle: the plain plan for V ranks (no canonical layer), its step s being the V
    # ranks' packs s*G .. s*G+G-1.
    plain = ReaderConfig.build(
        world_size=V, ranks_per_node=4, pack_size=4, window=4, scope=scope,
        grad_accum=grad_accum, seed=3, packing=packing,
    )  # fmt: skip
    want = steps_of(full_plan(INDEX, plain, 0).plan.packs, grad_accum)
    used = full_plan(INDEX, plain, 0).plan.packs
    for r, per_node in ((V, 4), (V // 2, 4), (V // 2, 2), (V // 4, 1), (1, 1)):
        cfg = config(
            r, scope=scope, grad_accum=grad_accum, packing=packing, ranks_per_node=per_node
        )
        got = full_plan(INDEX, cfg, 0).plan.packs
        assert got.shape == (r, used.shape[1] * V // r, 4)
        assert steps_of(got, grad_accum * V // r) == want, f"R={r}"
        check_every_record_once(got, used, what=f"R={r}")
        plan = canonical_plan(INDEX, cfg, 0)
        assert plan.remainder_counts() == full_plan(INDEX, plain, 0).remainder_counts()
        for s in (0, plan.n_steps - 1):
            assert sorted(map(tuple, plan.step_packs(s).tolist())) == want[s]


@pytest.mark.parametrize(
    ("v", "per_c", "r", "per_node"),
    [(8, 4, 4, 2), (8, 2, 4, 2), (8, 2, 2, 1), (16, 8, 4, 1), (16, 4, 8, 4), (12, 3, 6, 3)],
)
def test_nodes_host_whole_canonical_nodes_each_once(
    v: int, per_c: int, r: int, per_node: int
) -> None:
    from bcl_stream.planner.canonical import node_hosts

    hosts = [node_hosts(v, per_c, r, per_node, n) for n in range(r // per_node)]
    assert sorted(c for h in hosts for c in h) == list(range(v))
    share = v * per_node // r
    for h in hosts:
        assert len(h) == share
        if share % per_c == 0:  # whole canonical nodes: each one read by one physical node
            assert sorted({c // per_c for c in h}) == sorted(c // per_c for c in h[::per_c])
            assert all(
                h[i : i + per_c] == list(range(h[i], h[i] + per_c)) for i in range(0, share, per_c)
            )


def test_a_physical_node_runs_only_the_packs_of_the_canonical_ranks_it_hosts() -> None:
    from bcl_stream.planner.canonical import node_hosts, physical_packs

    plain = ReaderConfig.build(
        world_size=V, ranks_per_node=2, pack_size=4, window=4, scope="node", grad_accum=2, seed=3
    )
    canonical = full_plan(INDEX, plain, 0).plan.packs
    cfg = config(4, ranks_per_node=2, canonical_ranks_per_node=2, scope="node")
    got = full_plan(INDEX, cfg, 0).plan.packs  # (4, n*2, B)
    per = cfg.micro_batches_per_step
    # the simulator's whole-plan mapping and the readers' lazy walk agree
    assert np.array_equal(got, physical_packs(canonical, np.asarray(INDEX.costs()), 4, 2, 2, 2))
    for node in range(2):
        hosted = node_hosts(V, 2, 4, 2, node)
        assert hosted == ([0, 1, 4, 5] if node == 0 else [2, 3, 6, 7])  # strided nodes
        for s in range(canonical.shape[1] // 2):
            mine = got[2 * node : 2 * node + 2, s * per : (s + 1) * per].reshape(-1, 4)
            theirs = canonical[hosted, 2 * s : 2 * s + 2].reshape(-1, 4)
            assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, theirs.tolist()))


@pytest.mark.parametrize(
    "contract",
    [{}, {"contract": "tokens", "max_tokens": 4096}],
    ids=["pack", "tokens"],
)
def test_reader_walk_equals_whole_plan_from_any_start(contract: dict[str, object]) -> None:
    """Under either contract (a token plan's micro-batches vary: compared without padding)."""
    cfg = config(4, ranks_per_node=2, **contract)
    plan = canonical_plan(INDEX, cfg, 0)
    whole = full_plan(INDEX, cfg, 0).plan.packs
    check_walks_from_any_start(plan.iter_rank_packs, whole, (0, 1, 7, 8, plan.n_packs - 1))


def test_micro_batches_run_heaviest_first_within_a_step() -> None:
    cfg = config(2)
    packs = full_plan(INDEX, cfg, 0).plan.packs
    costs = np.asarray(INDEX.costs())[packs].sum(axis=2)  # (R, n)
    per = cfg.micro_batches_per_step
    for s in range(0, packs.shape[1] - per, per):
        assert np.all(np.diff(costs[:, s : s + per], axis=1) <= 0)


def test_refusals_name_what_works() -> None:
    with pytest.raises(ValueError, match=r"cannot run on 3 data-parallel ranks.*\[1, 2, 4, 8\]"):
        config(3, ranks_per_node=1)
    with pytest.raises(ValueError, match=r"canonical_ranks_per_node=3 does not divide"):
        config(2, canonical_ranks_per_node=3)
    with pytest.raises(ValueError, match="contract='pack'"):
        config(2, contract="step", layout="padded")
    with pytest.raises(ValueError, match="needs canonical_ranks"):
        ReaderConfig.build(world_size=2, pack_size=4, window=4, canonical_ranks_per_node=2)
    # canonical_ranks_per_node left unpinned: a fresh run uses the physical ranks per node,
    # and the cursor records the value used
    unpinned = config(4, canonical_ranks_per_node=None)
    assert unpinned.canonical_ranks_per_node is None and unpinned.canonical_node_ranks == 4
    assert unpinned.to_dict()["canonical_ranks_per_node"] == 4


def cursor_state(r: int, consumed: int) -> dict[str, object]:
    state = Cursor(0, consumed, INDEX.fingerprint(), config(r)).to_dict()
    return json.loads(json.dumps(state))


def test_cursor_counts_steps_and_resumes_at_the_same_step_on_any_size() -> None:
    state = cursor_state(2, 3 * 8)  # R=2: G = 2 * 8/2 = 8 micro-batches per step
    assert (state["canonical_steps"], state["step_micro_batches"]) == (3, 0)
    assert parse_state(state).config.canonical_ranks == V
    for r in (8, 4, 2, 1):
        cursor = resolve_state(state, fingerprint=INDEX.fingerprint(), config=config(r))
        assert cursor.packs_consumed == 3 * 2 * V // r and cursor.segments == ()
        # the resumed micro-batches are exactly the uninterrupted R's from step 3 on
        whole = full_plan(INDEX, config(r), 0).plan.packs
        plan = canonical_plan(INDEX, config(r), 0)
        got = np.concatenate([p for _, p in plan.iter_rank_packs(r - 1, cursor.packs_consumed)])
        assert np.array_equal(got, whole[r - 1, cursor.packs_consumed :])


def test_cursor_inside_a_step_resumes_on_its_own_size_only() -> None:
    state = cursor_state(2, 3 * 8 + 5)
    assert (state["canonical_steps"], state["step_micro_batches"]) == (3, 5)
    same = resolve_state(state, fingerprint=INDEX.fingerprint(), config=config(2))
    assert same.packs_consumed == 29
    with pytest.raises(StateError, match=r"inside optimizer step 3 \(5 of its 8.*Resume on 2"):
        resolve_state(state, fingerprint=INDEX.fingerprint(), config=config(4))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"canonical_steps": 2}, "canonical_steps=2.*corrupt"),
        ({"step_micro_batches": -1}, "step_micro_batches must be an integer"),
        ({"version": 5}, "version 5 cannot hold canonical_ranks"),
    ],
)
def test_malformed_canonical_cursors_are_refused(changes: dict[str, object], match: str) -> None:
    state = {**cursor_state(2, 24), **changes}
    with pytest.raises(StateError, match=match):
        parse_state(state)


def test_canonical_settings_must_match_to_resume() -> None:
    state = cursor_state(2, 16)
    for cfg, name in (
        (config(2, canonical_ranks=4), "canonical_ranks"),
        (config(1, canonical_ranks_per_node=2), "canonical_ranks_per_node"),
        (config(2, grad_accum=1), "grad_accum"),
        (config(2, canonical_ranks=None, canonical_ranks_per_node=None), "canonical_ranks"),
    ):
        with pytest.raises(StateError, match=f"saved with {name}="):
            resolve_state(state, fingerprint=INDEX.fingerprint(), config=cfg)
    plain = {**cursor_state(2, 16), "canonical_steps": 2}
    plain["config"] = ReaderConfig.build(world_size=2, pack_size=4, window=4).to_dict()
    with pytest.raises(StateError, match="no canonical_ranks"):
        parse_state(plain)


def test_an_unpinned_canonical_node_size_is_adopted_from_the_cursor() -> None:
    # saved on 1 node of 2 ranks with nothing pinned: the cursor records 2 per canonical node
    saved = config(2, ranks_per_node=2, canonical_ranks_per_node=None)
    state = json.loads(json.dumps(Cursor(0, 16, INDEX.fingerprint(), saved).to_dict()))
    assert state["config"]["canonical_ranks_per_node"] == 2
    # resumed on 2 nodes of 1 rank, nothing pinned: 2 is adopted, not the physical 1
    fresh = config(2, ranks_per_node=1, canonical_ranks_per_node=None)
    assert fresh.canonical_node_ranks == 1
    cursor = resolve_state(state, fingerprint=INDEX.fingerprint(), config=fresh)
    assert cursor.config.canonical_ranks_per_node == 2 and cursor.config.plan.ranks_per_node == 1
    assert cursor.packs_consumed == 16
    # the same steps as the saved layout's: the canonical plan does not change
    assert np.array_equal(
        canonical_plan(INDEX, cursor.config, 0).step_packs(2),
        canonical_plan(INDEX, saved, 0).step_packs(2),
    )
    # pinned to the saved value: resumes; pinned to another: refused naming both values
    same = config(2, ranks_per_node=1, canonical_ranks_per_node=2)
    assert resolve_state(state, fingerprint=INDEX.fingerprint(), config=same).config == same
    with pytest.raises(
        StateError,
        match=r"saved with canonical_ranks_per_node=2 but the loader sets "
        r"canonical_ranks_per_node=1.*Leave canonical_ranks_per_node unset",
    ):
        resolve_state(
            state,
            fingerprint=INDEX.fingerprint(),
            config=config(2, ranks_per_node=1, canonical_ranks_per_node=1),
        )


def test_a_mixture_keeps_its_steps_and_so_its_shares_at_every_size() -> None:
    from bcl_stream.epoch.mixture_index import MixtureIndex, StreamSpec

    rng = np.random.default_rng(1)
    sources = [np.sort(rng.lognormal(4, 0.6, 1500).astype(np.int64) + 1),
               rng.lognormal(5, 0.4, 1000).astype(np.int64) + 1]  # fmt: skip
    parts = []
    for lengths in sources:
        shards = [
            ShardEntry(f"s{i}", min(100, lengths.size - i)) for i in range(0, lengths.size, 100)
        ]
        parts.append(CostIndex.build(lengths, get_preset("tokens"), shards, "mds"))
    mix = MixtureIndex([StreamSpec("a", proportion=0.6), StreamSpec("b", proportion=0.4)], parts)
    plain = ReaderConfig.build(
        world_size=V, ranks_per_node=4, pack_size=4, window=4, scope="world", grad_accum=2, seed=3
    )
    want = steps_of(full_plan(mix, plain, 0).plan.packs, 2)
    for r in (V, V // 2, V // 4):
        got = full_plan(mix, config(r), 0).plan.packs
        assert steps_of(got, 2 * V // r) == want, f"R={r}"


def test_simulated_canonical_layout_needs_whole_canonical_accumulation() -> None:
    from bcl_stream.analysis.sim import SimConfig

    with pytest.raises(ValueError, match="canonical_ranks=8 needs ranks dividing it"):
        SimConfig(ranks=4, ranks_per_node=4, grad_accum=1, canonical_ranks=8)
    with pytest.raises(ValueError, match="canonical_ranks=8 needs ranks dividing it"):
        SimConfig(ranks=3, ranks_per_node=3, grad_accum=8, canonical_ranks=8)


@pytest.mark.parametrize(
    ("v", "per_c", "r", "per_node", "g", "n"),
    [
        (8, 4, 4, 2, 2, 9), (8, 2, 2, 2, 3, 7), (16, 8, 4, 1, 1, 5), (16, 4, 8, 4, 4, 12),
        (12, 3, 6, 3, 2, 5), (12, 6, 3, 1, 5, 11), (32, 8, 8, 8, 4, 16), (6, 1, 6, 6, 2, 3),
    ],
)  # fmt: skip
@pytest.mark.parametrize("balanced", [True, False])
def test_mapping_invariants(
    v: int, per_c: int, r: int, per_node: int, g: int, n: int, balanced: bool
) -> None:
    """Any layout: every step's packs are the canonical step's, each once; a node runs only the
    packs of the canonical ranks it hosts; heaviest first within a rank when balanced."""
    from bcl_stream.planner.canonical import node_hosts, physical_packs

    rng = np.random.default_rng(v * 100 + r)
    packs = rng.permutation(v * n * 2).reshape(v, n, 2).astype(np.int64)
    costs = rng.lognormal(0, 1, v * n * 2)
    out = physical_packs(packs, costs, r, per_node, per_c, g, balanced)
    k = v // r
    assert out.shape == (r, n * k, 2)
    for s in range(0, n, g):
        width = min(g, n - s)
        step = out[:, s * k : (s + width) * k]
        assert sorted(map(tuple, step.reshape(-1, 2).tolist())) == sorted(
            map(tuple, packs[:, s : s + width].reshape(-1, 2).tolist())
        )
        for node in range(r // per_node):
            hosted = node_hosts(v, per_c, r, per_node, node)
            mine = step[node * per_node : (node + 1) * per_node].reshape(-1, 2)
            theirs = packs[hosted, s : s + width].reshape(-1, 2)
            assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, theirs.tolist()))
        if balanced:
            assert np.all(np.diff(costs[step].sum(axis=2), axis=1) <= 1e-12)
