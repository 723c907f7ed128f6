"""The one resume harness every stateful component's tests use: run k packs (or steps), save,
resume in a fresh object (or a fresh process), and compare with the uninterrupted run.

Two entry points, one comparison:

- :func:`run_test_save_load_state` drives an object with ``state_dict``/``load_state_dict``
  and ``__iter__`` in this process (a ``PackLoader`` over any reader, a mixture, a
  DataModule through :class:`DataModuleLoader`): for each position it takes k packs from one
  object, passes its state through JSON (as a checkpoint does), loads it into a fresh object
  and reads on; the packs and the epoch boundaries must be the uninterrupted run's.
- :func:`check_resumed_runs` is for what only a trainer or a process can resume (Lightning,
  Fabric, DDP, a CLI run): the test gives the uninterrupted run's per-step log and a function
  that runs a resume from the save after k steps; every resumed log must be the reference's
  tail from step k (:func:`check_resumed_log` for one log of a run that resumes several
  ranks at once).

Positions default to every pack of the first epoch, its end, and a few packs into the next
(:func:`resume_positions` gives the three a slow test can afford: mid-epoch, the epoch end,
into the next epoch), the cases torchdata's ``run_test_save_load_state`` covers.

Kept free of bcl_stream and pytest: the expectation is the uninterrupted run (or a plan the
test passes in), never the code under test's idea of where it stopped, and subprocess
scripts can import it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
C = TypeVar("C")


class StatefulLoader(Protocol):
    """What Lightning and Fabric save and restore: an iterable with a JSON-able state."""

    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def pack_key(pack: Any) -> tuple[Hashable, ...]:
    """The record ids of a pack: a list of records (``sample_id`` each), or a collated batch
    (a ``sample_ids`` tensor)."""
    if isinstance(pack, dict):
        return tuple(int(i) for i in pack["sample_ids"].tolist())
    return tuple(int(s["sample_id"]) for s in pack)


def take(
    loader: StatefulLoader, count: int, key: Callable[[Any], Hashable] = pack_key
) -> list[list[Hashable]]:
    """``count`` packs as per-epoch chunks, without exhausting the last iterator (the way a
    trainer checkpoints right after a batch, before it knows the epoch ended)."""
    chunks: list[list[Hashable]] = []
    it: Iterator[Any] | None = None
    while count > 0:
        if it is None:
            it, chunk = iter(loader), []
            chunks.append(chunk)
        try:
            chunk.append(key(next(it)))
            count -= 1
        except StopIteration:
            it = None
            if not chunk:
                chunks.pop()
    return chunks


def resume_positions(per_epoch: int, mid: int | None = None) -> tuple[int, int, int]:
    """Mid-epoch (default: a third of the way), the epoch end, three packs into the next."""
    return (per_epoch // 3 if mid is None else mid), per_epoch, per_epoch + 3


def run_test_save_load_state(
    make_loader: Callable[[], StatefulLoader],
    epochs: int = 2,
    positions: Iterable[int] | None = None,
    *,
    key: Callable[[Any], Hashable] = pack_key,
    make_resumed: Callable[[], StatefulLoader] | None = None,
    reference: Sequence[Sequence[Hashable]] | None = None,
) -> None:
    """For each position k (default: every pack of the first epoch, its end, and a few into
    the next), stop after k packs, save the state through JSON, load it into a fresh loader
    (``make_resumed``: one built otherwise, say with another worker count), read to the end
    of ``epochs`` epochs: packs and epoch boundaries equal ``reference`` (packs by epoch;
    default: the uninterrupted run of ``make_loader``)."""
    if reference is None:
        loader = make_loader()
        reference = [[key(p) for p in loader] for _ in range(epochs)]
    flat = [p for chunk in reference for p in chunk]
    bounds = list(itertools.accumulate(len(c) for c in reference))
    assert bounds[0] > 0, "the harness needs a non-empty first epoch"
    if positions is None:
        positions = [*range(bounds[0] + 1), bounds[0] + 1, bounds[0] + 3]
    for k in positions:
        before: list[list[Hashable]] = []
        resumed = (make_resumed or make_loader)()
        if k:
            first = make_loader()
            before = take(first, k, key)
            state = json.loads(json.dumps(first.state_dict()))
            del first
            resumed.load_state_dict(state)
        done = sum(len(c) for c in before)
        after: list[list[Hashable]] = []
        while done + sum(len(c) for c in after) < len(flat):
            after.append([key(p) for p in resumed])
            assert after[-1], f"resume after {k}: an empty epoch before the end"
        got = [p for c in before + after for p in c]
        _same_tail(got, flat, f"resume after {k} packs")
        # The resumed loader's epochs end where the reference's do.
        ends = set(itertools.accumulate((len(c) for c in after), initial=done))
        assert ends - {done} <= set(bounds), f"resume after {k}: epoch bounds"


@dataclass
class ElasticRun:
    """What :func:`run_elastic_resume` read: the record ids before the save and after the
    resume, the state saved, and the resumed loaders (one per new rank, each read to its end)."""

    state: dict[str, Any]
    """The state the new ranks loaded (through JSON)."""
    consumed: list[Hashable]
    rest: list[Hashable]
    resumed: list[Any]
    lengths: set[int]
    """``len`` of each resumed loader right after its state was loaded."""

    @property
    def ids(self) -> list[Hashable]:
        return self.consumed + self.rest


def run_elastic_resume(
    make_loader: Callable[[C, int], Any], saved: C, resized: C, old: int, new: int, packs: int
) -> ElasticRun:
    """Read ``packs`` packs on each of ``old`` ranks (``make_loader(saved, rank)``), save the
    last rank's state through JSON (a checkpoint holds one), load it into each of ``new``
    ranks' fresh loaders (``make_loader(resized, rank)``) and read them to their end. The
    test checks what comes back: every record once, the same length on every new rank."""
    consumed: list[Hashable] = []
    state: dict[str, Any] = {}
    for rank in range(old):
        loader = make_loader(saved, rank)
        consumed += [i for chunk in take(loader, packs) for pack in chunk for i in pack]
        state = json.loads(json.dumps(loader.state_dict()))
    run = ElasticRun(state, consumed, [], [], set())
    for rank in range(new):
        loader = make_loader(resized, rank)
        loader.load_state_dict(state)
        run.lengths.add(len(loader))
        run.rest += [i for pack in loader for i in pack_key(pack)]
        run.resumed.append(loader)
    return run


def check_resumed_runs(
    reference: Sequence[T], resume: Callable[[int], Sequence[T]], positions: Iterable[int]
) -> None:
    """``reference`` is the uninterrupted run's log, one entry per step from step 0 (say
    (step, epoch, record ids)); ``resume(k)`` runs a fresh trainer or process from the state
    saved after k steps and returns its log. Each must be ``reference[k:]``, entry for entry."""
    for k in positions:
        check_resumed_log(reference, k, resume(k))


def check_resumed_log(reference: Sequence[T], step: int, resumed: Sequence[T]) -> None:
    """One resumed log against the uninterrupted one: ``resumed == reference[step:]`` (for a
    run that resumes several ranks or streams at once, checked one log at a time)."""
    assert 0 < step <= len(reference), f"no save after step {step} in a run of {len(reference)}"
    _same_tail(list(resumed), list(reference[step:]), f"resume after {step} steps")


class DataModuleLoader:
    """A DataModule seen as one stateful loader, in the order Lightning restores it: set up,
    ``load_state_dict`` on the DataModule, then ``train_dataloader()`` (built at the first
    ``iter``) and its epochs; the state saved is the DataModule's."""

    def __init__(
        self,
        module: Any,
        rank: int = 0,
        world: int = 1,
        per_node: int = 1,
        grad_accum: int | None = None,
    ) -> None:
        self.module = module
        module.setup_for(rank, world, per_node, grad_accum)
        self._loader: Any = None

    def __iter__(self) -> Iterator[Any]:
        if self._loader is None:
            self._loader = self.module.train_dataloader()
        return iter(self._loader)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self.module.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)


def _same_tail(got: list[Any], want: list[Any], what: str) -> None:
    """``got == want``, or the first step where they part."""
    if got == want:
        return
    first = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )
    raise AssertionError(
        f"{what} differs from the uninterrupted run at entry {first} "
        f"({len(got)} entries, want {len(want)}): "
        f"{got[first : first + 1]} != {want[first : first + 1]}"
    )
