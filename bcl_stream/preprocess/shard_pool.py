"""Shard work in parallel, results in shard order: threads fetch, processes decode.

``annotate`` reads every shard of a dataset once. Serially, a remote dataset of 100K shards is
hours of one download after another, and decoding (tar walking, hashing, MDS parsing) uses one
core. Here the two are split: a thread pool fetches shards ahead (I/O waits, so threads are
enough and share the process's connections), a pool of spawned processes decodes them (CPU),
and results come back strictly in submission order, so what is built from them (the cost
index) is byte-identical to a serial run for any worker count. Both stages bound how far they
run ahead (``ahead`` shards), so memory and local disk hold a few shards, never the dataset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")
R = TypeVar("R")

FETCH_THREADS = 8
"""Concurrent downloads (each builds its own client: ~0.3 s here, so overlap matters)."""


def _in_order(
    pool: Executor | None, fn: Callable[[T], U], items: Iterable[T], ahead: int
) -> Iterator[U]:
    """``fn(item)`` for each item, in order, at most ``ahead`` submitted and not yet taken
    (``pool`` None: called inline, one at a time)."""
    if pool is None:
        yield from map(fn, items)
        return
    pending: deque[Future[U]] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def map_shards(
    work: Callable[[T], R],
    jobs: Iterable[T],
    *,
    workers: int = 1,
    fetch: Callable[[T], T] | None = None,
    done: Callable[[T], None] | None = None,
) -> Iterator[R]:
    """``work(fetch(job))`` for every job, in job order.

    ``work`` runs in ``workers`` spawned processes (1: in this process), so it and its jobs
    must pickle (a module-level function, plain data). ``fetch`` (a remote read: download the
    shard, return the job pointing at the local copy) runs in threads ahead of ``work``;
    ``done(fetched job)`` runs after its result is taken (delete the local copy).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    with ExitStack() as stack:
        threads = stack.enter_context(ThreadPoolExecutor(FETCH_THREADS)) if fetch else None
        procs = None
        if workers > 1:
            procs = stack.enter_context(
                ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
            )
        fetched = jobs if fetch is None else _in_order(threads, fetch, jobs, 2 * FETCH_THREADS)
        if done is None:
            yield from _in_order(procs, work, fetched, 2 * workers)
            return
        held: deque[T] = deque()

        def remember(stream: Iterable[T]) -> Iterator[T]:
            for job in stream:
                held.append(job)
                yield job

        for result in _in_order(procs, work, remember(fetched), 2 * workers):
            done(held.popleft())
            yield result
