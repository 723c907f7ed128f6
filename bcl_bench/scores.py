"""How ``tools/bench_balance.py`` scores a schedule: its metrics under both sync modes (every
micro-batch, once per optimizer step of :data:`ACCUM` micro-batches) and its gains over the
baselines, per unit of useful cost (a strategy that leaves records out is not faster for it).
"""

from __future__ import annotations

from bcl_stream.analysis.sim import Schedule, imbalance_sq, metrics_from_costs, useful_cost

ACCUM = 4
"""Micro-batches per optimizer step (G) of the balance benchmark."""


def score(s: Schedule, base: dict[str, Schedule], accum: int = ACCUM) -> dict[str, float]:
    """Metrics of one schedule (both sync modes, ``accum`` micro-batches per step) and its gains
    over the baselines in ``base``: ``speedup_vs_NAME`` is time per unit of useful cost of the
    baseline over that of ``s``, ``cv_reduction`` is against ``sequential``."""
    out: dict[str, float] = {}
    for sync in ("microbatch", "step"):
        m = metrics_from_costs(
            s.pack_costs, s.records_used, s.records_left, microbatches_per_step=accum,
            sync=sync, step_sizes=s.step_sizes,
        )  # fmt: skip
        suffix = "" if sync == "microbatch" else "_step"
        out |= {f"efficiency{suffix}": m.efficiency, f"cv_ranks{suffix}": m.cv_ranks}
        if sync == "microbatch":
            out |= {"cv_time": m.cv_time, "records_left": m.records_left}
            if s.squared_lengths is not None:
                out["imbalance_sq"] = imbalance_sq(s.squared_lengths)
        for name, b in base.items():
            bm = metrics_from_costs(
                b.pack_costs, 0, 0, microbatches_per_step=accum, sync=sync, step_sizes=b.step_sizes
            )
            per_cost = (bm.time / useful_cost(b)) / (m.time / useful_cost(s))
            out[f"speedup_vs_{name}{suffix}"] = per_cost
            if name == "sequential":
                out[f"cv_reduction{suffix}"] = 1.0 - m.cv_ranks / bm.cv_ranks
    return out
