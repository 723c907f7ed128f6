"""The peer registry (``bcl_stream.peers.PEERS``) is the one list of peers, and each peer
behaves as its entry says: the record-count contract it keeps or breaks, whether the token
capacity M changes its plan, and the upstream revision its fixtures were recorded at."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.analysis.sim import STRATEGIES, SimConfig, schedules
from bcl_stream.cost import get_preset
from bcl_stream.peers import PEERS, REAL_PEERS, Pool, global_order, plan_pooled

FIXTURES = Path(__file__).parent / "fixtures"
R, B, G = 4, 4, 2


def _pool(n: int = 4 * R * B * G, seed: int = 3) -> Pool:
    """A skewed stream (lognormal lengths): one where breaking the contract shows."""
    rng = np.random.default_rng(seed)
    tokens = np.minimum(rng.lognormal(5.0, 1.2, n).astype(np.int64) + 1, 3000)
    return Pool(global_order(n, seed, 0), tokens, R, B, G)


def _as_lists(bins: list[list[np.ndarray]]) -> list[list[list[int]]]:
    return [[mb.tolist() for mb in rank] for rank in bins]


def test_the_simulator_runs_exactly_the_registered_peers_in_registry_order() -> None:
    assert ("sequential", *PEERS, "bcl-rank", "bcl-node", "bcl-world") == STRATEGIES
    assert all(peer.name == name for name, peer in PEERS.items())
    assert REAL_PEERS == ("nemo_mffd", "verl_kk", "hf_rebalance")
    planned = schedules(
        np.arange(1, 513), get_preset("tokens"), SimConfig(ranks=2, ranks_per_node=2), (*PEERS,)
    )
    assert tuple(planned) == tuple(PEERS)


@pytest.mark.parametrize("name", list(PEERS))
def test_a_peer_keeps_the_record_count_contract_exactly_when_its_entry_says_so(name: str) -> None:
    pool = _pool()
    bins, _ = plan_pooled(name, pool, int(pool.tokens.max()) * B)
    sizes = {mb.size for rank in bins for mb in rank}
    assert (sizes == {B}) == PEERS[name].keeps_contract, sizes


@pytest.mark.parametrize("name", list(PEERS))
def test_the_capacity_changes_a_plan_exactly_when_the_entry_says_the_peer_uses_it(
    name: str,
) -> None:
    pool = _pool()
    longest = int(pool.tokens.max())
    tight = _as_lists(plan_pooled(name, pool, longest)[0])
    roomy = _as_lists(plan_pooled(name, pool, longest * B * 4)[0])
    assert (tight != roomy) == (PEERS[name].capacity is not None)


def test_the_real_peers_name_the_revisions_their_upstream_fixtures_were_recorded_at() -> None:
    upstream = json.loads((FIXTURES / "peers_upstream.json").read_text())
    hf = json.loads((FIXTURES / "hf_rebalance_upstream.json").read_text())
    assert upstream["nemo_rl_revision"] in PEERS["nemo_mffd"].follows
    assert upstream["verl_revision"] in PEERS["verl_kk"].follows
    assert upstream["verl_revision"] in PEERS["verl_dynbsz"].follows
    assert hf["transformers_version"] in PEERS["hf_rebalance"].follows
    assert all(PEERS[name].reproduces for name in PEERS)


def test_an_unknown_or_renamed_peer_is_refused_with_the_name_to_use() -> None:
    pool = _pool()
    with pytest.raises(ValueError, match=r"renamed pooled_mffd_split.*nemo_mffd"):
        plan_pooled("pooled_mffd", pool, 4096)
    with pytest.raises(ValueError, match=r"unknown pooled strategy 'sequential'.*'hf_rebalance'"):
        plan_pooled("sequential", pool, 4096)
