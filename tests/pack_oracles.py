"""Expectations for what loaders yield, computed without the planner: the one "every record
once" oracle (:func:`check_every_record_once`: yielded plus reported left out equals the
expected ids, naming what is missing, duplicated or unexpected), the properties every epoch
must have, and the exact packs of the one case simple enough to write down by hand.

Kept free of bcl_stream so a test's expectation cannot come from the code it checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

Packs = Sequence[Sequence[Sequence[int]]]
"""packs[rank][t] = the record ids of rank ``rank``'s t-th pack."""


def flat_ids(nested: object) -> list[Hashable]:
    """The record ids in ``nested`` (packs by rank and epoch, a plan array, a remainder dict
    of reason -> ids, any mix), in order. Ints and strings are ids; arrays and tensors (numpy
    or torch: anything with ``tolist``), lists, tuples, sets, ranges and dict values are walked
    into."""
    if hasattr(nested, "tolist"):
        nested = nested.tolist()
    if isinstance(nested, (int, str)):
        return [nested]
    items: Iterable[object] = nested.values() if isinstance(nested, dict) else nested  # type: ignore[assignment]
    return [i for item in items for i in flat_ids(item)]


@dataclass(frozen=True)
class Accounting:
    """What an epoch's records became, against the ids it should have used."""

    missing: list[Hashable] = field(default_factory=list)
    """Expected ids neither yielded nor reported left out."""
    duplicated: dict[Hashable, int] = field(default_factory=dict)
    """Ids seen more than once (yielded twice, or yielded and reported), with their count."""
    unexpected: list[Hashable] = field(default_factory=list)
    """Ids yielded or reported that are not expected (another epoch's, out of range)."""

    def __str__(self) -> str:
        parts = [
            f"{name} {len(ids)}: {sorted(ids, key=repr)[:10]}"
            for name, ids in (
                ("missing", self.missing),
                ("duplicated", list(self.duplicated)),
                ("unexpected", self.unexpected),
            )
            if ids
        ]
        return "; ".join(parts) or "every record once"


def account(
    yielded: object, expected: int | Iterable[Hashable] | None = None, left_out: object = ()
) -> Accounting:
    """Compare the ids ``yielded`` plus those reported ``left_out`` with ``expected`` (an int
    n stands for ``range(n)``; None: only repeats are looked for)."""
    seen = Counter(flat_ids(yielded) + flat_ids(left_out))
    duplicated = {i: n for i, n in seen.items() if n > 1}
    if expected is None:
        return Accounting(duplicated=duplicated)
    want = set(range(expected)) if isinstance(expected, int) else set(flat_ids(expected))
    return Accounting(
        missing=sorted(want - seen.keys(), key=repr),
        duplicated=duplicated,
        unexpected=sorted(seen.keys() - want, key=repr),
    )


def check_every_record_once(
    yielded: object,
    expected: int | Iterable[Hashable] | None = None,
    left_out: object = (),
    what: str = "",
) -> None:
    """Every ``expected`` id was yielded or reported left out, exactly once, and nothing else
    was (``expected=None``: no id twice, for a run whose full id set the test cannot know).
    The failure says which ids are missing, duplicated or unexpected."""
    result = account(yielded, expected, left_out)
    assert not (result.missing or result.duplicated or result.unexpected), (
        f"{what}: {result}" if what else str(result)
    )


def micro_batches(packs: np.ndarray, pad: int = -1) -> list[tuple[int, ...]]:
    """The micro-batches of a plan array (``(..., width)``), each the tuple of its record ids
    with ``pad`` entries (a token-contract plan's padding) dropped."""
    return [tuple(int(i) for i in row if i != pad) for row in packs.reshape(-1, packs.shape[-1])]


def check_walks_from_any_start(
    walk: Callable[[int, int], Iterable[tuple[object, np.ndarray]]],
    whole: np.ndarray,
    starts: Iterable[int],
) -> None:
    """A reader's walk of rank r's plan from pack ``start`` (``walk(r, start)``: pairs of
    anything and its packs as an array, as ``iter_rank_packs`` gives them) yields exactly the
    whole plan's micro-batches from there (``whole[r, start:]``), for every rank of ``whole``
    and each start."""
    for start in starts:
        for rank in range(whole.shape[0]):
            got = [b for _, packs in walk(rank, start) for b in micro_batches(packs)]
            assert got == micro_batches(whole[rank, start:]), f"rank {rank} from pack {start}"


def check_epoch(packs: Packs, n_records: int, pack_size: int, left_out: int) -> None:
    """Every rank yields the same number of packs of exactly ``pack_size`` records, no record
    twice, and the records yielded plus the ``left_out`` ones reported are the epoch's
    ``n_records``."""
    counts = [len(rank) for rank in packs]
    assert len(set(counts)) == 1, f"ranks yield different pack counts: {counts}"
    sizes = {len(pack) for rank in packs for pack in rank}
    assert sizes <= {pack_size}, f"pack sizes {sorted(sizes)}, want exactly {pack_size}"
    ids = flat_ids(packs)
    check_every_record_once(ids, what="a record was yielded twice")
    assert not account(ids, n_records).unexpected, f"ids outside 0..{n_records - 1}"
    assert len(ids) + left_out == n_records, (len(ids), left_out, n_records)


def write_order_packs(
    n_records: int, ranks: int, pack_size: int, window: int
) -> tuple[list[list[list[int]]], int]:
    """``packing="sequential"``, ``shuffle=False``, one node: the node's stream is the write
    order 0..n-1, cut into chunks of ``window`` packs per rank; rank r takes the r-th slice
    of every chunk, in consecutive packs of ``pack_size`` (the last chunk holds as many whole
    packs per rank as the records left allow). Returns (packs by rank, records left over)."""
    packs: list[list[list[int]]] = [[] for _ in range(ranks)]
    start = 0
    while (per_rank := min(window, (n_records - start) // (ranks * pack_size))) > 0:
        for rank in range(ranks):
            first = start + rank * per_rank * pack_size
            for t in range(per_rank):
                packs[rank].append(list(range(first + t * pack_size, first + (t + 1) * pack_size)))
        start += ranks * per_rank * pack_size
    return packs, n_records - start


def balance_efficiency(packs: Packs, costs: np.ndarray) -> float:
    """``sum_t mean_r C[r,t] / sum_t max_r C[r,t]`` with C the pack cost from ``costs``."""
    cost = np.array([[float(costs[list(pack)].sum()) for pack in rank] for rank in packs])
    return float(cost.mean(axis=0).sum() / cost.max(axis=0).sum())
