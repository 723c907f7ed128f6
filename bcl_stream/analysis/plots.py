"""Plots people would rather look at than read. matplotlib is imported lazily (Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_step_costs(
    matrices: dict[str, npt.NDArray[np.float64]], path: str | Path, max_steps: int = 64
) -> Path:
    """One panel per strategy: each rank's pack cost per step (lines), max over ranks (bold).

    Costs are normalized by the strategy's mean pack cost so panels share an axis.
    """
    plt = _pyplot()
    names = list(matrices)
    fig, axes = plt.subplots(
        len(names), 1, figsize=(10, 2.2 * len(names)), sharex=True, squeeze=False
    )
    for ax, name in zip(axes[:, 0], names, strict=True):
        c = np.asarray(matrices[name], dtype=np.float64)[:, :max_steps]
        norm = c / c.mean() if c.size and c.mean() > 0 else c
        for rank_costs in norm:
            ax.plot(rank_costs, lw=0.7, alpha=0.5)
        if norm.size:
            ax.plot(norm.max(axis=0), color="black", lw=1.8, label="max over ranks (step time)")
            eff = c.mean(axis=0).sum() / c.max(axis=0).sum()
            ax.set_title(f"{name}: efficiency {eff:.3f} over the steps shown", fontsize=9)
        ax.set_ylabel("cost / mean")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("step (micro-batch)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
