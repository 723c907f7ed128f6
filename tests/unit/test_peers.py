"""The pooled peers reproduce NeMo-RL and verl exactly, and keep their invariants.

Fidelity: ``fixtures/peers_upstream.json`` holds fixed inputs and the outputs of the upstream
code itself on them (NeMo-RL ``ModifiedFirstFitDecreasingPacker`` and
``BatchedDataDict.shard_by_batch_size``; verl ``karmarkar_karp``,
``get_seqlen_balanced_partitions``, ``RayPPOTrainer._balance_batch`` and
``rearrange_micro_batches``), run once at the revisions named in the file, which are the ones
``nemo.py`` and ``verl.py`` follow. A few smaller cases below are worked out by hand from
the upstream code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_oracles import check_every_record_once
from upstream_fixtures import upstream

from bcl_stream.peers import PEERS as POOLED
from bcl_stream.peers import Pool, plan_pooled
from bcl_stream.peers.nemo import NEMO_RL_REVISION, adjust_bin_count, mffd_bins, nemo_mffd
from bcl_stream.peers.verl import (
    VERL_REVISION,
    balance_batch,
    balanced_partitions,
    dynamic_micro_batches,
    karmarkar_karp,
    pipe_order,
    verl_dynbsz,
    verl_kk,
    verl_workload,
)

UPSTREAM = upstream("peers")


def whole_stream(case: dict[str, Any]) -> Pool:
    """The pool of one recorded upstream run over a whole stream."""
    return Pool(
        np.array(case["order"]),
        np.array(case["tokens"]),
        case["world_size"],
        case["pack_size"],
        case["grad_accum"],
    )


def as_lists(bins: list[list[np.ndarray]]) -> list[list[list[int]]]:
    return [[b.tolist() for b in rank] for rank in bins]


def test_fixtures_come_from_the_revisions_the_modules_follow() -> None:
    assert UPSTREAM["nemo_rl_revision"] == NEMO_RL_REVISION
    assert UPSTREAM["verl_revision"] == VERL_REVISION


# ----------------------------------------------------------------------------- fidelity


@pytest.mark.parametrize("case", UPSTREAM["mffd"], ids=lambda c: f"C{c['capacity']}")
def test_nemo_mffd_bins_match_nemo_rl(case: dict[str, Any]) -> None:
    bins = mffd_bins(case["sizes"], case["capacity"])
    assert bins == case["bins"]
    assert adjust_bin_count(bins, case["multiple"], case["multiple"]) == case["adjusted"]


@pytest.mark.parametrize("case", UPSTREAM["streams"], ids=lambda c: f"R{c['world_size']}")
def test_nemo_mffd_ranks_match_nemo_rl_shard_by_batch_size(case: dict[str, Any]) -> None:
    bins, left = nemo_mffd(whole_stream(case), case["capacity"])
    assert as_lists(bins) == case["nemo_mffd"]
    assert left["epoch_tail"].tolist() == case["epoch_tail"]


@pytest.mark.parametrize("case", UPSTREAM["kk"], ids=lambda c: f"k{c['k']}-eq{c['equal_size']}")
def test_karmarkar_karp_matches_verl(case: dict[str, Any]) -> None:
    assert karmarkar_karp(case["values"], case["k"], case["equal_size"]) == case["parts"]
    assert balanced_partitions(case["values"], case["k"], case["equal_size"]) == case["balanced"]


@pytest.mark.parametrize("case", UPSTREAM["balance_batch"], ids=lambda c: f"R{c['world_size']}")
def test_balance_batch_matches_verl_trainer(case: dict[str, Any]) -> None:
    workload = verl_workload(np.array(case["lengths"])).tolist()
    assert balance_batch(workload, case["world_size"]) == case["ranks"]


@pytest.mark.parametrize("case", UPSTREAM["dynamic"], ids=lambda c: f"n{len(c['lengths'])}")
def test_dynamic_micro_batches_match_verl(case: dict[str, Any]) -> None:
    lengths = case["lengths"]
    # rearrange_micro_batches: own count, then at least min_micro (the all-reduce MAX stand-in).
    own = min(len(lengths), -(-sum(lengths) // case["max_token_len"]))
    n_micro = max(own, case["min_micro"])
    got = dynamic_micro_batches(lengths, verl_workload(np.array(lengths)).tolist(), n_micro)
    assert got == case["micro_batches"]


@pytest.mark.parametrize("case", UPSTREAM["streams"], ids=lambda c: f"R{c['world_size']}")
def test_verl_peers_match_verl_on_whole_streams(case: dict[str, Any]) -> None:
    pool = whole_stream(case)
    kk, left = verl_kk(pool)
    assert as_lists(kk) == case["verl_kk"]
    assert left["epoch_tail"].tolist() == case["epoch_tail"]
    dyn, _ = verl_dynbsz(pool, case["capacity"])
    assert as_lists(dyn) == case["verl_dynbsz"]


# ----------------------------------------------------------------------------- by hand


def test_adjust_bin_count_moves_single_records_from_the_bin_with_most_records() -> None:
    bins = [[0, 1, 2], [3, 4], [5]]
    # One more bin: the last record of the 3-record bin moves; nothing is split in halves.
    assert adjust_bin_count(bins, 4, 4) == [[0, 1], [3, 4], [5], [2]]
    # Two more: NeMo-RL keeps taking from the same bin until it holds one record.
    assert adjust_bin_count(bins, 5, 5) == [[0], [3, 4], [5], [2], [1]]
    assert adjust_bin_count(bins, 3, 3) == bins
    with pytest.raises(ValueError, match="cannot make 8 bins"):
        adjust_bin_count(bins, 8, 8)


def test_mffd_fills_large_bins_first_then_least_loaded_bins() -> None:
    # C=60: 35, 31 large; 22 medium; 11, 12 small; 3, 9, 8 tiny.
    sizes = [35, 31, 22, 11, 12, 3, 9, 8]
    # Phase 2: 35 takes 22. Phase 3: 31 takes the small pair 11, 12 (54, 6 left).
    # Phase 4: 35+22 takes 3 (full); nothing else fits anywhere. Phase 5: 9 opens a bin,
    # 8 joins the least-loaded open bin.
    assert mffd_bins(sizes, 60) == [[0, 2, 5], [1, 3, 4], [6, 7]]
    # Only tiny items: largest first into the least-loaded open bin that fits, new bins
    # appended after equal loads; bins come out in increasing load.
    assert mffd_bins([5, 5, 5, 1], 60) == [[0, 1, 2, 3]]
    assert mffd_bins([6, 6, 6], 12) == [[2], [0, 1]]


def test_karmarkar_karp_by_hand() -> None:
    # States {2},{1} and {4},{3} (spread 1 each; the one with the larger top set pops first),
    # merged largest-with-smallest: {4,1} and {3,2}, both 5; ties by item list.
    assert karmarkar_karp([1, 2, 3, 4], 2, equal_size=True) == [[3, 0], [2, 1]]
    assert balanced_partitions([1, 2, 3, 4], 2, equal_size=True) == [[0, 3], [1, 2]]


def test_pipe_order_puts_small_items_at_both_ends() -> None:
    workload = [5, 1, 4, 2, 3]
    assert pipe_order(range(5), workload) == [1, 4, 0, 2, 3]  # workloads 1, 3, 5, 4, 2
    assert pipe_order([0, 1], [7, 7]) == [0, 1]  # ties by position


def test_verl_workload_is_24576_l_plus_l_squared() -> None:
    assert verl_workload(np.array([0, 1, 4096])).tolist() == [0, 24577, 24576 * 4096 + 4096**2]


# ----------------------------------------------------------------------------- invariants


streams = st.builds(
    lambda r, b, g, extra, seed: (r, b, g, r * b * g * extra + seed % (r * b * g), seed),
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(0, 2**16),
)


def _stream(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tok = np.minimum(rng.lognormal(5.0, 1.3, n).astype(np.int64) + 1, 4000)
    return rng.permutation(n), tok


@settings(max_examples=60, deadline=None)
@given(stream=streams, name=st.sampled_from(sorted(POOLED)))
def test_every_peer_emits_every_record_once_and_equal_counts_per_rank(
    stream: tuple[int, int, int, int, int], name: str
) -> None:
    r, b, g, n, seed = stream
    order, tok = _stream(n, seed)
    capacity = int(max(tok.max(), b * tok.mean()))
    bins, left = plan_pooled(name, Pool(order, tok, r, b, g), capacity)
    check_every_record_once(bins, n, left_out=left["epoch_tail"])
    if POOLED[name].pooled:  # global batches of R*B*G; multipack allocates the whole order
        assert left["epoch_tail"].size == n % (r * b * g)
    assert len({len(rank) for rank in bins}) == 1  # collectives never hang
    assert all(mb.size > 0 for rank in bins for mb in rank)
    if name == "verl_kk":  # the record-count contract: G micro-batches of exactly B
        assert all(mb.size == b for rank in bins for mb in rank)
        assert len(bins[0]) == g * (n // (r * b * g))
    elif name not in ("verl_dynbsz", "hf_rebalance"):  # no per-micro-batch bound there
        assert all(int(tok[mb].sum()) <= capacity for rank in bins for mb in rank)


@settings(max_examples=40, deadline=None)
@given(stream=streams)
def test_verl_kk_gives_each_rank_one_equal_share_of_each_global_batch(
    stream: tuple[int, int, int, int, int],
) -> None:
    r, b, g, n, seed = stream
    order, tok = _stream(n, seed)
    bins, _ = verl_kk(Pool(order, tok, r, b, g))
    gbs = r * b * g
    for k in range(n // gbs):
        share = [np.concatenate(rank[k * g : (k + 1) * g]) for rank in bins]
        check_every_record_once(share, order[k * gbs : (k + 1) * gbs], what=f"batch {k}")
        work = [int(verl_workload(tok[s]).sum()) for s in share]
        # KK with equal sizes never does worse than the heaviest record apart.
        assert max(work) - min(work) <= int(
            verl_workload(tok[order[k * gbs : (k + 1) * gbs]]).max()
        )


def test_records_the_peers_refuse_are_named() -> None:
    order, tok = np.arange(8), np.array([5, 5, 5, 5, 5, 5, 5, 90])
    with pytest.raises(ValueError, match="record 7: 90 tokens"):
        nemo_mffd(Pool(order, tok, 2, 2, 2), capacity=50)
    with pytest.raises(ValueError, match="record 7: 90 tokens exceed max_token_len 50"):
        verl_dynbsz(Pool(order, tok, 2, 2, 2), max_token_len=50)
    with pytest.raises(ValueError, match="record 2: 0 tokens"):
        nemo_mffd(Pool(order, np.array([5, 5, 0, 5, 5, 5, 5, 5]), 2, 2, 2), capacity=50)
    with pytest.raises(ValueError, match="unknown pooled strategy"):
        plan_pooled("pooled_mffd", Pool(order, tok, 2, 2, 2), 100)
    with pytest.raises(ValueError, match="must be >= 1"):
        verl_kk(Pool(order, tok, 0, 2, 2))
