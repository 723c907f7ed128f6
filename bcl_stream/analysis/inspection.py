"""``inspect``: what a dataset holds and whether its cost index still matches its shards.

One dictionary (the ``--json`` output) with the record count, token and cost statistics,
for an image-text dataset its image tokens and encoder patches (``image_tokens``, ``patches``:
total, mean, p50, p99, max; ``images``: counts; None for text), the cost model, outliers above a cap, the preprocessing report when there is one, and the
integrity verdict (``ok`` plus a list of ``problems``). Nothing raises for a broken dataset:
a broken dataset is exactly what ``inspect`` is for, so every failure becomes a problem line.
A remote store that cannot be used at all (credentials, endpoint) is no verdict on the data:
that :class:`~bcl_stream.errors.RemoteAccessError` is raised.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bcl_stream.errors import BCLStreamError, RemoteAccessError
from bcl_stream.formats.dataset_files import check_integrity, integrity_checks, open_file_layout
from bcl_stream.io.dataset_dir import detect_format
from bcl_stream.io.index import CostIndex
from bcl_stream.io.index_meta import column_stats
from bcl_stream.io.remote import is_remote
from bcl_stream.planner.cuts import MIN_SHARDS_PER_NODE, TEAM_SHARDS
from bcl_stream.preprocess.fetch import fetch_dataset
from bcl_stream.process_layout import ProcessLayout
from bcl_stream.vision.components import read_components

EMPTY_STATS = column_stats(())


def _outliers(tokens: npt.NDArray[np.uint32], cap: int | None) -> dict[str, Any]:
    if cap is None:
        return {"max_tokens": None, "count": 0, "largest": []}
    over = np.flatnonzero(tokens > cap)
    top = over[np.argsort(tokens[over], kind="stable")[::-1][:5]]
    return {
        "max_tokens": cap,
        "count": int(over.size),
        "largest": [{"record": int(i), "tokens": int(tokens[i])} for i in top],
    }


def _empty(location: str, max_tokens: int | None) -> dict[str, Any]:
    return {
        "location": location,
        "format": None,
        "records": 0,
        "shards": 0,
        "tokens": dict(EMPTY_STATS),
        "cost": dict(EMPTY_STATS),
        "trained": dict(EMPTY_STATS),
        "image_tokens": None,
        "patches": None,
        "images": None,
        "cost_model": {},
        "outliers": _outliers(np.zeros(0, np.uint32), max_tokens),
        "preprocess": None,
        "ok": False,
        "problems": [],
    }


def inspect_dataset(
    directory: str | os.PathLike[str],
    *,
    max_tokens: int | None = None,
    plot: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The inspection report of a dataset directory or remote URL (see the module docstring);
    ``plot``: also draw :func:`plot_inspection` there.

    A remote dataset is downloaded whole to a temporary directory first (every tar is needed to
    count its members).
    """
    if is_remote(directory):
        with tempfile.TemporaryDirectory(prefix="bcl_inspect_") as tmp:
            try:
                root = fetch_dataset(str(directory), tmp, progress=False)
            except RemoteAccessError:
                raise  # not a verdict on the dataset: the store cannot be used at all
            except BCLStreamError as exc:
                return {**_empty(str(directory), max_tokens), "problems": [str(exc)]}
            report = inspect_dataset(root, max_tokens=max_tokens, plot=plot)
            report["location"] = str(directory)
            report["problems"] = [p.replace(str(root), str(directory)) for p in report["problems"]]
            return report
    root = Path(directory)
    report = _empty(str(root), max_tokens)
    try:
        report["format"] = detect_format(root)
        layout = open_file_layout(root, verify=True)
    except BCLStreamError as exc:
        report["problems"].append(str(exc))
        return report
    index: CostIndex = layout.index
    summary = index.summary()
    report.update(
        records=len(index),
        shards=len(index.shards),
        tokens=summary["tokens"],
        cost=summary["cost"],
        trained=summary["trained"],
        cost_model=index.cost_model.to_dict(),
        outliers=_outliers(index.tokens, max_tokens),
        preprocess=index.extra.get("preprocess") or index.extra.get("annotate"),
    )
    try:  # image-text datasets: their stored components (None for text)
        components = read_components(root, index.tokens)
    except BCLStreamError as exc:
        report["problems"].append(str(exc))
        components = None
    if components is not None:
        parts = components.summary()
        report.update(
            image_tokens=parts["image_tokens"],
            patches=parts["patches"],
            images={"count": parts["images"], "records_with_images": parts["records_with_images"]},
        )
    started = time.perf_counter()
    report["problems"] += check_integrity(root, index)
    report["checks"] = integrity_checks(root, index)
    report["integrity_seconds"] = time.perf_counter() - started
    report["ok"] = not report["problems"]
    if plot is not None and len(index):
        plot_inspection(index, plot, max_tokens)
    return report


def plot_inspection(index: CostIndex, path: str | os.PathLike[str], cap: int | None) -> None:
    """Token-count histogram and the share of total cost held by records up to each length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = index.tokens.astype(np.float64)
    cost = index.costs()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    hi = max(float(tokens.max()), 2.0)
    lo = max(float(tokens.min()), 1.0)
    bins = np.logspace(np.log10(lo), np.log10(hi + 1), 60)
    left.hist(np.maximum(tokens, 1), bins=bins, color="tab:blue")
    left.set(xscale="log", yscale="log", xlabel="tokens per record", ylabel="records")
    left.set_title(f"{len(index)} records, mean {tokens.mean():.0f} tokens")
    order = np.argsort(tokens, kind="stable")
    # float64 sums: the stored costs are float32 (a read-only view of the mapped index).
    share = np.cumsum(cost[order], dtype=np.float64) / max(
        float(cost.sum(dtype=np.float64)), 1e-300
    )
    right.plot(tokens[order], share, color="tab:red")
    right.set(xscale="log", xlabel="tokens per record", ylabel="cumulative share of cost")
    right.set_title(f"cost model {index.cost_model.name}")
    for ax in (left, right):
        if cap is not None:
            ax.axvline(cap, color="k", linestyle="--", label=f"cap {cap}")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def shard_warnings(shards: int, records: int, layout: ProcessLayout) -> list[str]:
    """What the shard count means for a plan on ``layout`` (its nodes): a node reads only its
    own shards, so with few shards per node its stream cannot carry the dataset's mix, and
    the planner cuts shards so that several nodes read each (``planner/cuts.py``: below
    ``TEAM_SHARDS`` per node; below 2 per node every node reads every shard). Empty when
    there are enough."""
    nodes = layout.nodes
    if nodes == 1 or shards >= TEAM_SHARDS * nodes:
        return []
    per_node = shards / nodes
    want = max(1, records // (TEAM_SHARDS * nodes))
    effect = (
        "every node reads every shard (download amplification = nodes)"
        if per_node < MIN_SHARDS_PER_NODE
        else "the planner cuts shards so that several nodes read each (more downloads)"
    )
    return [
        f"{shards} shards for {nodes} nodes: {per_node:.1f} per node, below the "
        f"{TEAM_SHARDS} a node's stream should draw from to carry the dataset's mix; {effect}. "
        f"Rewrite with at most {want} records per shard (preprocess --shard-records {want})."
    ]
