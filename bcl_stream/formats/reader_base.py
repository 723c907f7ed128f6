"""What the MDS and WebDataset readers share: a torch IterableDataset that yields one rank's
packs of the epoch plan, from a cursor, split over DataLoader workers.

The cursor is not this class's: its one owner is ``PackLoader``
(``bcl_stream/loading/loader.py``), which hands (epoch, first pack, segments) over with
:meth:`PlanDataset._set_cursor` right before each ``iter()``. The hand-over is the one way
worker processes learn of it: the values go into a ``share_memory_()`` tensor created with the
dataset, which every worker's copy of the dataset shares, persistent workers included (they
keep their copy forever, so plain attributes set later in the main process never reach them).
Each worker reads the tensor when its iterator starts. The read-only properties ``epoch``,
``start`` and ``segments`` show the last hand-over; nothing else moves the cursor.

Worker split: worker w of K yields items w, w+K, ... of ``packs_per_item`` consecutive packs
from the cursor on (1: single packs); torch's DataLoader takes one item from each worker in
turn, which restores the plan order for any K (and K=0). Each process plans its rank's windows
lazily as it reaches them (:class:`~bcl_stream.epoch.plan.ReaderPlan`), so no process holds
the epoch's plan.

A subclass implements :meth:`PlanDataset._read_packs` (record ids -> record dicts).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info

from bcl_stream.epoch.canonical import canonical_plan
from bcl_stream.epoch.eval_plan import EvalPlan
from bcl_stream.epoch.loss_tokens import StepTokens, step_tokens
from bcl_stream.epoch.plan import PlanData, ReaderConfig, ReaderPlan, Segment, reader_plan
from bcl_stream.epoch.process_group import process_group
from bcl_stream.epoch.schedule import Schedule
from bcl_stream.epoch.steps import StepCut, step_cut, whole_steps
from bcl_stream.epoch.terms import record_costs
from bcl_stream.errors import DatasetError, StateError
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.formats.token_ids import resolve_source
from bcl_stream.io.index import CostIndex
from bcl_stream.io.remote import is_remote, open_cost_index
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.token_contract import EMPTY
from bcl_stream.records.source import RecordSource

log = logging.getLogger(__name__)
Record = dict[str, Any]
Pack = list[Record]
MAX_SEGMENTS = 32
"""World-size changes one epoch's cursor can carry to worker processes (elastic resume)."""


def detect_rank() -> int:
    """This process's data-parallel rank: the process group's if one is initialised, else
    env ``RANK`` (0 when unset)."""
    group = process_group()
    return group.rank if group is not None else int(os.environ.get("RANK", "0"))


class PlanDataset(IterableDataset[Pack]):
    """Yields rank ``rank``'s packs (lists of exactly ``pack_size`` record dicts; under
    ``contract="step"`` micro-batches of varying size, G*B records per step; under
    ``contract="tokens"`` micro-batches of at most ``max_tokens`` tokens) in plan order.

    Each record dict holds at least ``sample_id`` (global index in write order) and the
    record's columns (``input_ids`` as a numpy array for datasets bcl-stream writes).
    ``len()`` is the number of packs per rank in the current epoch, equal on every rank.
    ``rank`` is a data-parallel rank: under tensor or context parallelism every process of a
    group passes the group's rank and yields the same packs (``config.plan.world_size`` then
    divides the process group); None takes the process group's rank (one process a rank),
    else env ``RANK``. An explicit rank wins over the group's.
    """

    location: str = ""
    """Where the data is (subclasses set it; for messages)."""

    def __init__(self, index: PlanData, config: ReaderConfig, rank: int | None = None) -> None:
        super().__init__()
        self.index = index
        self._config = config.fitted(index)
        self.rank = detect_rank() if rank is None else int(rank)
        group = process_group()
        if group is not None:
            # The plan's ranks are data-parallel ranks. A rank detected from the process group
            # is a process: one per plan rank. A rank given by the caller may be a data-parallel
            # rank shared by a tensor/context-parallel group of world // world_size processes.
            world = group.world_size
            dp = config.plan.world_size
            if world != dp and (rank is None or world % dp):
                raise ValueError(
                    f"ReaderConfig.world_size={dp} but the process group has {world} ranks; "
                    f"ranks would disagree on the plan. Set world_size={world} (or leave it "
                    "out of ReaderConfig.build, which takes the group's), or (tensor or "
                    "context parallelism) pass the data-parallel rank explicitly with a "
                    "world_size that divides the process group."
                )
        if not 0 <= self.rank < config.plan.world_size:
            raise ValueError(f"rank must be in [0, {config.plan.world_size}), got {self.rank}")
        self.fingerprint = index.fingerprint()
        # [epoch, first pack, n segments, (world_size, ranks_per_node, packs_consumed) * n]:
        # the loader's last hand-over, shared with worker processes, persistent ones included.
        self._cursor = torch.zeros(3 + 3 * MAX_SEGMENTS, dtype=torch.int64).share_memory_()
        self.packs_per_item = 1
        """Packs per DataLoader item (PackLoader sets it for worker processes)."""
        self.step_loss_tokens = False
        """Put each step's trained-token count on the records where the plan knows it
        (``epoch/loss_tokens.py``; the DataModule turns it on before any worker starts)."""
        self._evaluation: EvalPlan | None = None

    @property
    def config(self) -> ReaderConfig:
        """The config this reader was built with (``ReaderConfig.fitted`` to its index).
        Read-only: every worker's copy, the plan cache and the cursor follow the config a
        reader was built with, so a different config is a different reader
        (:meth:`with_canonical_layout`)."""
        return self._config

    def with_canonical_layout(self, config: ReaderConfig) -> PlanDataset:
        """A new reader of the same opened data built with ``config``, which may differ from
        this reader's in ``canonical_ranks_per_node`` only: a resume that adopts the saved
        canonical node size (``epoch/cursor.py``; ``PackLoader.load_state_dict`` swaps the
        reader). It shares the index, the files and the options (the canonical layout moves
        no shard between this rank's readers) and has a cursor of its own; this reader is left
        as it was."""
        same = replace(config, canonical_ranks_per_node=self._config.canonical_ranks_per_node)
        if same != self._config:
            raise ValueError(
                "a reader's config is fixed when it is built; only canonical_ranks_per_node "
                f"can be adopted from a cursor (this reader: {self._config.flat()}, asked: "
                f"{config.flat()}). Open a new reader with that config."
            )
        other = copy.copy(self)
        other._config = config
        other._cursor = torch.zeros_like(self._cursor).share_memory_()
        return other

    def for_evaluation(self, packing: str = "sequential") -> PlanDataset:
        """Read for validation or test (``epoch/eval_plan.py``): every record once across
        ranks, equal pack counts, packs of at most B records, no epochs; returns ``self``."""
        costs = record_costs(self.index, self.config.cost_model)
        self._evaluation = EvalPlan(
            np.asarray(costs[np.arange(len(self.index))]),
            self.config.plan.world_size,
            self.config.plan.pack_size,
            packing,
            self.location,
        )
        return self

    # -- cursor (owned by PackLoader) -----------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._cursor[0])

    @property
    def start(self) -> int:
        return int(self._cursor[1])

    @property
    def segments(self) -> tuple[Segment, ...]:
        values = self._cursor[3 : 3 + 3 * int(self._cursor[2])].view(-1, 3).tolist()
        return tuple(Segment(*row) for row in values)

    def _set_cursor(self, epoch: int, start: int, segments: tuple[Segment, ...] = ()) -> None:
        """Yield from pack ``start`` of ``epoch`` (after ``segments``) on the next ``iter()``,
        in this process and in every worker. Called by the cursor's owner, ``PackLoader``."""
        if epoch < 0 or start < 0:
            raise ValueError(f"epoch and start must be >= 0, got {epoch}, {start}")
        if len(segments) > MAX_SEGMENTS:
            raise StateError(
                f"{len(segments)} world-size changes in one epoch; a reader follows at most "
                f"{MAX_SEGMENTS}. Finish the epoch on one world size, or start it over without "
                "the loader state."
            )
        flat = [v for s in segments for v in (s.world_size, s.ranks_per_node, s.packs_consumed)]
        self._cursor[: 3 + len(flat)] = torch.tensor([epoch, start, len(segments), *flat])

    # -- plan -----------------------------------------------------------------------------
    def epoch_plan(
        self, epoch: int | None = None, segments: tuple[Segment, ...] | None = None
    ) -> ReaderPlan:
        """The plan of ``epoch`` with elastic ``segments`` (default: the current cursor's):
        lazy, windows are planned as the iterator reaches them. Under ``canonical_ranks``:
        the canonical plan as this physical layout walks it (``epoch/canonical.py``), which a
        reader uses as it uses a ``ReaderPlan``."""
        if epoch is None:
            epoch = self.epoch
        if self.config.canonical_ranks is not None:
            return canonical_plan(self.index, self.config, epoch)  # type: ignore[return-value]
        if segments is None:
            segments = self.segments if epoch == self.epoch else ()
        return reader_plan(self.index, self.config, epoch, segments)

    def describe_mixture(self) -> list[dict[str, Any]] | None:
        """The mixture the plan reads, as a cursor records it (None: one dataset)."""
        return None

    def rank_packs(self) -> npt.NDArray[np.int64]:
        """(n_packs, pack_size) record ids this rank yields in the current epoch."""
        return self.epoch_plan().rank_packs(self.rank)

    def __len__(self) -> int:
        if self._evaluation is not None:
            return self._evaluation.n_packs
        return self.epoch_plan().n_packs

    def remainder_counts(self) -> dict[str, int]:
        """Records of the current epoch no rank yields, by reason (same on every rank)."""
        return self.epoch_plan().remainder_counts()

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Packs from the cursor on; with ``packs_per_item`` > 1, lists of up to that many consecutive
        packs (one DataLoader item each: see :class:`~bcl_stream.loading.loader.PackLoader`)."""
        per_item = self.packs_per_item
        current: list[Pack] = []
        current_id = -1
        for pack_id, pack in self._mine():
            if per_item == 1:
                yield pack
                continue
            if pack_id != current_id and current:
                yield current
                current = []
            current_id = pack_id
            current.append(pack)
        if current:
            yield current

    def _mine(self) -> Iterator[tuple[int, Pack]]:
        """(item id, pack) of the packs this worker yields, from the cursor on: item c holds
        packs start + c*packs_per_item ...; worker w takes items w, w+workers, ...

        One walk over the plan's :class:`~bcl_stream.epoch.schedule.Schedule`, whatever the
        contract and whatever made the plan (lazy, canonical, evaluation). Rank by rank, unless
        a step must be seen whole (:meth:`_step_view`): then the packs of the rank's planning
        group (``group=True``), whole steps at a time, each turned into this rank's
        micro-batches by :meth:`_step_packs`."""
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        start, per_item = self.start, self.packs_per_item
        plan: Schedule = self._evaluation or self.epoch_plan()
        view = self._step_view()
        g = 1 if view is None else self.config.plan.grad_accum
        batches = plan.iter_rank_packs(self.rank, start - start % g, group=view is not None)
        if view is not None:
            batches = whole_steps(batches, g)
        for first, packs in batches:
            position = first - start + np.arange(packs.shape[-2])
            ids = np.where(position >= 0, position // per_item, -1)
            mask = (position >= 0) & (ids % workers == worker)
            if not mask.any():
                continue
            if view is None:
                yield from zip(ids[mask].tolist(), self._read_rows(packs[mask]), strict=True)
            else:
                yield from self._step_packs(packs, mask, ids, *view)

    def _step_view(self) -> tuple[StepCut | None, StepTokens | None] | None:
        """What makes a reader see each step whole: the ``step`` contract's re-cut
        (``epoch/steps.py``) and each step's trained-token count where the plan knows it
        (``epoch/loss_tokens.py``); None when neither applies (evaluation included)."""
        if self._evaluation is not None:
            return None
        cut = step_cut(self.index, self.config)
        steps = None
        if self.step_loss_tokens:
            steps = step_tokens(self.index, self.config, self.segments)
        return None if cut is None and steps is None else (cut, steps)

    def _step_packs(
        self,
        group: npt.NDArray[np.int64],
        mask: npt.NDArray[np.bool_],
        ids: npt.NDArray[np.int64],
        cut: StepCut | None,
        steps: StepTokens | None,
    ) -> Iterator[tuple[int, Pack]]:
        """This worker's (item id, micro-batch) of whole steps ``group`` (row_ranks, n, width)
        of the rank's planning group: its own packs, or under the ``step`` contract its share
        of each step's re-cut (a worker reads the whole step of every micro-batch it yields);
        every record tagged with its step's trained tokens where ``steps`` knows them."""
        g = self.config.plan.grad_accum
        local = self.rank % group.shape[0]  # its place among the ranks of its group
        totals = None
        if steps is not None:
            totals = steps.totals(group if steps.world else group[local : local + 1])
        if cut is None:
            chosen = np.flatnonzero(mask)
            read = self._read_rows(group[local][chosen])
            for j, pack in zip(chosen.tolist(), read, strict=True):
                yield int(ids[j]), _tagged(pack, steps, totals, j)
            return
        steps_here = np.unique(np.flatnonzero(mask) // g).tolist()
        cuts = [cut(group[:, k * g : k * g + g], local) for k in steps_here]
        rows = np.concatenate([mine.reshape(-1, self.config.plan.pack_size) for mine, _ in cuts])
        read = self._read_packs(rows)
        for k, (mine, sizes) in zip(steps_here, cuts, strict=True):
            if steps is not None and totals is not None and not steps.world:
                # the re-cut deals a step's records among the group's ranks: the rank's
                # share is what it received, not its planned packs
                totals[k * g : k * g + g] = steps.count(mine)
            records = [
                r for _ in range(mine.size // self.config.plan.pack_size) for r in next(read)
            ]
            ends = np.cumsum(sizes)
            for j in range(sizes.size):
                if mask[k * g + j]:
                    pack = records[ends[j] - sizes[j] : ends[j]]
                    yield int(ids[k * g + j]), _tagged(pack, steps, totals, k * g + j)

    def _read_packs(self, packs: npt.NDArray[np.int64]) -> Iterator[Pack]:
        """Yield one list of record dicts per row of ``packs`` (global record ids), in order."""
        raise NotImplementedError

    def _read_rows(self, packs: npt.NDArray[np.int64]) -> Iterator[Pack]:
        """:meth:`_read_packs` for rows that may be padded with ``EMPTY`` (-1: the tokens
        contract's micro-batches of varying size): the records are read in one pass, in
        row order, and regrouped."""
        real = packs != EMPTY
        if real.all():
            yield from self._read_packs(packs)
            return
        records = self._read_packs(packs[real].reshape(-1, 1))
        for width in real.sum(axis=1).tolist():
            yield [next(records)[0] for _ in range(width)]


def _tagged(
    pack: Pack, steps: StepTokens | None, totals: npt.NDArray[np.int64] | None, j: int
) -> Pack:
    """``pack`` with its step's trained-token count on every record (None: none)."""
    if steps is not None and totals is not None:
        for record in pack:
            record[steps.key] = int(totals[j])
    return pack


NOT_GIVEN = object()
"""The default of the refused ``prefetch=`` keyword (any value given is refused)."""


class DatasetReader(PlanDataset):
    """A reader of one costed dataset (MDS or WebDataset, not a mixture): its index is the
    dataset's :class:`~bcl_stream.io.index.CostIndex`. Records' ``input_ids`` come from the
    token source (``ReaderConfig.tokens``, or the one the index was counted from).

    The set-up both formats share is here, once: the constructor's parameters and
    :meth:`_open_dataset` (the cost index and its format, the token source, and the
    :class:`~bcl_stream.formats.read_options.ReadOptions`, the only place a prefetch depth, a
    cache limit or a download timeout is given: the old ``prefetch=`` keyword, which could
    contradict ``options``, is refused), plus the check that a ``cache_limit`` holds the
    node's shard working set (:meth:`_check_cache_fit`). A format adds what is its own in
    :meth:`_open_format`.

    ``location``: the dataset root, a local directory or a remote URL; ``rank``: the
    data-parallel rank (None: the process group's, else env ``RANK``); ``cache_dir``: the
    node's cache, required for a remote dataset; ``format_kwargs``: the format's own options
    (MDS: passed on to ``StreamingDataset``; WebDataset takes none).
    """

    index: CostIndex
    tokens: RecordSource | None = None
    """Where ``input_ids`` come from (None: the stored ``input_ids`` column)."""
    format: str = ""
    """``mds`` or ``wds`` (subclasses set it)."""
    options: ReadOptions
    remote: bool
    root: Path
    """The local directory holding the shards (a remote dataset's cache directory)."""

    def __init__(
        self,
        location: str | os.PathLike[str],
        config: ReaderConfig,
        rank: int | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        options: ReadOptions | None = None,
        prefetch: object = NOT_GIVEN,
        **format_kwargs: Any,
    ) -> None:
        index = self._open_dataset(location, config, rank, cache_dir, options, prefetch)
        self._open_format(index, cache_dir, **format_kwargs)

    def _open_format(
        self, index: CostIndex, cache_dir: str | os.PathLike[str] | None, **format_kwargs: Any
    ) -> None:
        """The format's own set-up, after :meth:`_open_dataset` (subclasses implement it)."""
        raise NotImplementedError

    def _open_dataset(
        self,
        location: str | os.PathLike[str],
        config: ReaderConfig,
        rank: int | None,
        cache_dir: str | os.PathLike[str] | None,
        options: ReadOptions | None,
        prefetch: object,
    ) -> CostIndex:
        """Open the cost index, check its format, set the plan up and the reading options."""
        refuse_prefetch_keyword(prefetch, options)
        if options is not None and not isinstance(options, ReadOptions):
            raise ValueError(f"options must be a ReadOptions, got {type(options).__name__}")
        self.location = str(location)
        self.options = options or ReadOptions()  # before the index: its download's limits
        index, self.root = self._open_index(self.location, cache_dir)
        if index.format != self.format:
            other = {"mds": "MDSPackDataset", "wds": "WDSPackDataset"}.get(index.format, "")
            raise DatasetError(
                f"{self.location}: the cost index says format {index.format!r}; use the reader "
                f"for that format{f' ({other})' if other else ''}"
            )
        PlanDataset.__init__(self, index, self._with_tokens(config, index), rank)
        self.remote = is_remote(self.location)
        return index

    def _open_index(
        self, location: str, cache_dir: str | os.PathLike[str] | None
    ) -> tuple[CostIndex, Path]:
        return open_cost_index(location, cache_dir, **self.options.download_limits())

    @property
    def prefetch(self) -> int:
        """Shards downloaded ahead of the one being read (``options.prefetch``)."""
        return self.options.prefetch

    def _check_cache_fit(self, shard_bytes: Sequence[int]) -> int | None:
        """Warn, at set-up, when ``cache_limit`` cannot hold the shards a node must hold at
        once (its working set: the shards of one shard group, at most its share of the
        dataset's shards, plus the prefetch, the largest ones counted); below it the cache
        deletes shards the node still needs and downloads them again (measured: each shard
        fetched 13-21 times an epoch). Returns the working set in bytes (None: no limit)."""
        limit = self.options.cache_bytes
        if limit is None or not self.remote or not shard_bytes:
            return None
        needed = working_set_bytes(shard_bytes, self.config.plan, self.options.prefetch)
        if limit < needed:
            message = (
                f"{self.location}: cache_limit {limit} bytes is below a node's shard working set "
                f"of about {needed} bytes ({_mb(needed)}: one shard group of "
                f"{self.config.plan.shard_group} shards or the node's share, plus prefetch "
                f"{self.options.prefetch}, largest shards counted); the cache will delete shards "
                f"the node still needs and download them again. Set cache_limit to at least "
                f"{_mb(needed)}, or lower shard_group."
            )
            log.warning(message)
            warnings.warn(message, UserWarning, stacklevel=3)
        return needed

    def _with_tokens(self, config: ReaderConfig, index: CostIndex) -> ReaderConfig:
        """The config this reader is built with: ``config`` with the index's token source
        where ``config`` names none (a different one is refused), so that the config the
        cursor records names it; built before the reader holds a config, never rewritten."""
        self.tokens = resolve_source(config.tokens, index, self.location)
        return config if self.tokens == config.tokens else replace(config, tokens=self.tokens)


def refuse_prefetch_keyword(prefetch: object, options: ReadOptions | None) -> None:
    """The readers took ``prefetch=`` beside ``options=`` and each format reconciled the two
    differently (MDS silently used ``options.prefetch``); there is one place now."""
    if prefetch is NOT_GIVEN:
        return
    have = "" if options is None else f" (options already says prefetch={options.prefetch})"
    raise ValueError(
        f"the reader keyword prefetch={prefetch!r} is gone{have}: give the depth in the "
        f"options, options=ReadOptions(prefetch={prefetch!r}) "
        "(bcl_stream.formats.read_options), or dataclasses.replace(options, prefetch=...)"
    )


def working_set_bytes(shard_bytes: Sequence[int], plan: PlanConfig, prefetch: int) -> int:
    """Bytes a node's cache must hold at once: the largest shards, as many as one shard group
    (or the node's share of the shards, if fewer) plus the prefetch depth."""
    nodes = max(1, plan.world_size // plan.ranks_per_node)
    share = -(-len(shard_bytes) // nodes)
    count = min(len(shard_bytes), min(plan.shard_group, share) + prefetch)
    return int(sum(sorted(shard_bytes, reverse=True)[:count]))


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f}mb" if n >= 1 << 20 else f"{n}b"
