"""Per-stream accounting of a mixture's epoch plan (for ``bcl-stream plan`` and reports)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bcl_stream.epoch.mixture_index import MixtureIndex
from bcl_stream.epoch.plan import REASON_CONSUMED, EpochPlan, PlanData, ReaderConfig


def stream_report(
    index: PlanData, config: ReaderConfig, plan: EpochPlan
) -> list[dict[str, Any]] | None:
    """Per stream of a mixture (None for one dataset), in the order given: its description,
    ``records_drawn`` (this epoch's draw, copies counted: ``records_per_epoch`` give or take
    the per-shard rounding), ``records_used`` (records the epoch's packs hold) and
    ``records_left`` (by reason: records of the draw no rank yields)."""
    if not isinstance(index, MixtureIndex):
        return None
    n = index.layout.n_streams
    drawn = index.draw(config.seed, plan.epoch).per_stream()
    ids = plan.plan.packs.ravel()
    used = np.bincount(index.locate(ids[ids >= 0])[0], minlength=n)  # tokens: -1 padding
    left: list[dict[str, int]] = [{} for _ in range(n)]
    remainder = dict(plan.plan.remainder)
    if plan.consumed.size:
        remainder[REASON_CONSUMED] = plan.consumed
    for reason, ids in remainder.items():
        per = np.bincount(index.locate(np.asarray(ids, np.int64))[0], minlength=n)
        for s in range(n):
            if per[s]:
                left[s][reason] = int(per[s])
    return [
        {
            **desc,
            "records_drawn": int(drawn[s]),
            "records_used": int(used[s]),
            "records_left": left[s],
        }
        for s, desc in enumerate(index.describe())
    ]
