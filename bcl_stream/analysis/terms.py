"""Per-term balance of a schedule: the vision encoder's and the language model's costs apart.

Why: the planner balances one number per record (the language term, or the summed two-term
cost, ``bcl_stream.vision.cost.TwoTermCost``; the readers then refine both terms,
``planner/two_term.py``), but a vision-language step runs two networks. When
the vision encoder runs as its own stage (all ranks encode their images, then all run the
language model), a rank waits at each stage for the slowest rank *of that stage*, so a pack
balanced in sum can still leave the encoder unbalanced. This module scores each term on its own
with the same definition as ``efficiency`` (``analysis/metrics.py``: sum_t mean_r / sum_t
max_r, per micro-batch or per optimizer step as the setting syncs), and models the step time
both ways:

- ``time_separate_stages`` = sum_t (max_r V[r, t] + max_r L[r, t]): the encoder is a stage of
  its own;
- ``time_one_stage`` = sum_t max_r (V[r, t] + L[r, t]): the encoder is part of one step;
- ``time_balanced_stages`` = sum_t (mean_r V[r, t] + mean_r L[r, t]): the separate-stage time
  if both terms were perfectly balanced at every micro-batch, the floor no reordering of the
  same micro-batches can beat.

Text-only data has no vision term: its ``efficiency_vision`` is None (absent), never 1.0.
Numpy only, like ``analysis/metrics.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.analysis.metrics import metrics_from_costs
from bcl_stream.planner.padded import Packs, ragged_pack_costs

TERM_KEYS = ("efficiency_vision", "efficiency_language")
"""The keys :func:`term_figures` adds beside ``efficiency`` in ``simulate --json``."""


def term_figures(
    packs: Packs,
    vision: npt.NDArray[np.float64] | None,
    language: npt.NDArray[np.float64],
    *,
    layout: str = "packed",
    sync: str = "microbatch",
    microbatches_per_step: int = 1,
    step_sizes: npt.NDArray[np.integer] | None = None,
) -> dict[str, Any]:
    """``efficiency_vision``, ``efficiency_language``, ``efficiency_summed`` and the modeled
    times (``time_separate_stages``, ``time_one_stage``, ``time_balanced_stages``, in the
    costs' unit) of one schedule.

    ``vision``, ``language``: per-record costs of each term, indexed by record id; ``vision``
    None: text-only data (the vision figures are None, the times those of the language term).
    The language term is scored under ``layout`` (padding is the language model's); the
    vision term always packed (each image is encoded at its own size, never padded).
    """

    def scored(matrix: npt.NDArray[np.float64]) -> tuple[float, float]:
        m = metrics_from_costs(
            matrix,
            0,
            0,
            microbatches_per_step=microbatches_per_step,
            sync=sync,
            step_sizes=step_sizes,
        )
        return m.efficiency, m.time

    lang = ragged_pack_costs(packs, np.asarray(language, dtype=np.float64), layout)
    eff_language, time_language = scored(lang)
    if vision is None:
        return {
            "efficiency_vision": None,
            "efficiency_language": eff_language,
            "efficiency_summed": eff_language,
            "time_separate_stages": time_language,
            "time_one_stage": time_language,
            "time_balanced_stages": eff_language * time_language,
        }
    vis = ragged_pack_costs(packs, np.asarray(vision, dtype=np.float64), "packed")
    eff_vision, time_vision = scored(vis)
    eff_summed, time_summed = scored(vis + lang)
    return {
        "efficiency_vision": eff_vision,
        "efficiency_language": eff_language,
        "efficiency_summed": eff_summed,
        "time_separate_stages": time_vision + time_language,
        "time_one_stage": time_summed,
        "time_balanced_stages": eff_vision * time_vision + eff_language * time_language,
    }
