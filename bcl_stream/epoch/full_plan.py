"""The whole epoch's plan for every rank, materialized: what ``bcl-stream plan`` prints and
tools and tests compare the readers with. Readers never build it; they follow the same plan
lazily (:class:`~bcl_stream.epoch.plan.ReaderPlan`).

Its own module because it is above both kinds of plan: the physical plan
(:mod:`bcl_stream.epoch.plan`) and the canonical plan built on it
(:mod:`bcl_stream.epoch.canonical`).
"""

from __future__ import annotations

from bcl_stream.epoch.cache import cached
from bcl_stream.epoch.canonical import canonical_plan
from bcl_stream.epoch.plan import EpochPlan, PlanData, ReaderConfig, Segment, reader_plan


def full_plan(
    index: PlanData,
    config: ReaderConfig,
    epoch: int,
    segments: tuple[Segment, ...] = (),
) -> EpochPlan:
    """The whole epoch's plan for every rank (cached): tools, ``bcl-stream plan`` and tests.
    Readers follow the same plan lazily (:class:`ReaderPlan`). ``segments``: earlier world
    sizes of this epoch, oldest first, each with the packs per rank consumed under it.
    """
    key = ("full", index.fingerprint(), config, epoch, segments)
    if config.canonical_ranks is not None:
        if segments:
            raise ValueError("a canonical plan has no elastic segments (its cursor counts steps)")
        return cached(key, lambda: canonical_plan(index, config, epoch).whole())
    return cached(key, lambda: reader_plan(index, config, epoch, segments).whole())
