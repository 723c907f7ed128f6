"""What canonical ranks cost in balance: a plan for V canonical ranks run on R = V, V/2, V/4
physical ranks, against planning for R directly (``tools/bench_elastic.py --canonical``).

Per corpus (``bcl_bench/text_corpora.py``: real corpora in write order, the five the defaults were
chosen on and the five held out) and per canonical layout, scope ``world``, B=8, W=16, a
canonical rank's accumulation G_c=4 (so R ranks accumulate G_c*V/R: the global batch is the
same V*G_c packs at every R), llama3-8b costs, shards of 4096 records:

- ``direct``: the planner run for R ranks (``ranks_per_node`` of the physical layout), G_c*V/R;
- ``canonical``: the plan for V ranks, mapped onto R ranks (``planner/canonical.py``: each
  physical node hosts whole canonical nodes, strided over the world, and deals each step's
  packs to its ranks heaviest first);
- ``canonical_undealt``: the same hosting, each rank running its own k hosted canonical ranks'
  packs in canonical order (no deal within the node, no heaviest-first order);
- ``canonical_consecutive``: physical nodes hosting consecutive canonical nodes (dealt);
- ``bound_no_locality``: every step's V*G_c packs dealt over all R ranks heaviest first in
  snake order, as if any rank could read any shard (amplification = physical nodes): what the
  canonical steps allow without locality.

Each is scored with docs/metrics.md's efficiency, synchronizing every micro-batch (FSDP) and
once per optimizer step (DDP ``no_sync``). At R = V canonical and direct are the same plan.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import text_corpora
from bcl_bench.harness import write_result
from bcl_stream.analysis.metrics import metrics_from_costs
from bcl_stream.analysis.sim import locality, shard_table
from bcl_stream.cost import get_preset
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.bcl import plan_epoch
from bcl_stream.planner.canonical import deal_step, physical_packs
from bcl_stream.planner.padded import ragged_pack_costs

PACK, WINDOW, G_C, CAP, SHARD = 8, 16, 4, 8192, 4096
LAYOUTS = ((4, 8), (16, 1))
"""Canonical layouts (nodes x data-parallel ranks per node): 4 nodes of 8 ranks (V=32) and
16 nodes of one data-parallel rank each (tensor parallelism inside a node, V=16). Physical
layouts keep the ranks per node and lose nodes: R = V, V/2, V/4."""


def efficiencies(
    packs: np.ndarray, costs: np.ndarray, per_step: int, table: Any, per_node: int
) -> dict[str, float]:
    """(R, n, B) packs -> efficiency synchronizing every micro-batch and every step, and the
    download amplification of the physical nodes (``analysis.sim.locality``)."""
    c = ragged_pack_costs(packs, costs, "packed")
    used = int(packs.size)
    micro = metrics_from_costs(c, used, 0).efficiency
    step = metrics_from_costs(c, used, 0, microbatches_per_step=per_step, sync="step").efficiency
    amplification, _ = locality(packs, table, per_node, WINDOW)
    return {
        "microbatch": round(float(micro), 5),
        "step": round(float(step), 5),
        "amplification": round(float(amplification), 3),
    }


def global_deal(packs: np.ndarray, costs: np.ndarray, ranks: int, accum: int) -> np.ndarray:
    """``bound_no_locality``: (V, n, B) -> (R, n*V/R, B), each step's packs over all ranks."""
    v, n, size = packs.shape
    out = np.empty((ranks, n * (v // ranks), size), dtype=np.int64)
    for s in range(0, n, accum):
        g = min(accum, n - s)
        out[:, s * v // ranks : (s + g) * v // ranks] = deal_step(packs[:, s : s + g], costs, ranks)
    return out


def run_corpus(
    name: str, n: int, layouts: tuple[tuple[int, int], ...] = LAYOUTS
) -> list[dict[str, Any]]:
    """One row per (canonical layout, physical size) of corpus ``name`` at ``n`` records."""
    tokens = text_corpora.build(name, n, CAP)
    costs = get_preset("llama3-8b").cost(tokens).astype(np.float64)
    table = shard_table(tokens, costs, SHARD)
    rows: list[dict[str, Any]] = []
    for nodes, per_node in layouts:
        v = nodes * per_node

        def plan(ranks: int, accum: int, per_node: int = per_node) -> np.ndarray:
            config = PlanConfig(
                world_size=ranks, ranks_per_node=per_node, pack_size=PACK, window=WINDOW,
                scope="world", grad_accum=accum,
            )  # fmt: skip
            return plan_epoch(costs, table, config, seed=0, epoch=0, tokens=tokens).packs

        t = time.perf_counter()
        canonical = plan(v, G_C)
        for ranks in (v, v // 2, v // 4):
            per_step = G_C * v // ranks
            direct = plan(ranks, per_step)
            mapped = physical_packs(canonical, costs, ranks, per_node, per_node, G_C, True)
            undealt = physical_packs(canonical, costs, ranks, per_node, per_node, G_C, False)
            consecutive = physical_packs(
                canonical, costs, ranks, per_node, per_node, G_C, hosting="consecutive"
            )
            rows.append(
                {
                    "corpus": name,
                    "held_out": name in text_corpora.HELD_OUT,
                    "records": n,
                    "canonical_layout": f"{nodes}x{per_node}",
                    "canonical_ranks": v,
                    "ranks": ranks,
                    "micro_batches_per_step": per_step,
                    "direct": efficiencies(direct, costs, per_step, table, per_node),
                    "canonical": efficiencies(mapped, costs, per_step, table, per_node),
                    "canonical_undealt": efficiencies(undealt, costs, per_step, table, per_node),
                    "canonical_consecutive": efficiencies(
                        consecutive, costs, per_step, table, per_node
                    ),
                    "bound_no_locality": efficiencies(
                        global_deal(canonical, costs, ranks, G_C), costs, per_step, table, per_node
                    ),
                }
            )
        print(f"{name:<30} {nodes}x{per_node} planned in {time.perf_counter() - t:5.1f}s: "
              + "  ".join(f"R={r['ranks']} direct {r['direct']['microbatch']:.3f} canonical "
                          f"{r['canonical']['microbatch']:.3f}" for r in rows[-3:]),
              flush=True)  # fmt: skip
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (canonical layout, R): the loss of canonical against direct in points, median and
    worst over corpora, for each synchronization."""
    out = []
    for lay in sorted({r["canonical_layout"] for r in rows}):
        for ranks in sorted(
            {r["ranks"] for r in rows if r["canonical_layout"] == lay}, reverse=True
        ):
            sel = [r for r in rows if r["canonical_layout"] == lay and r["ranks"] == ranks]
            entry: dict[str, Any] = {"canonical_layout": lay, "ranks": ranks, "corpora": len(sel)}
            for sync in ("microbatch", "step"):
                for variant in (
                    "canonical", "canonical_undealt", "canonical_consecutive", "bound_no_locality"
                ):  # fmt: skip
                    loss = [100 * (r["direct"][sync] - r[variant][sync]) for r in sel]
                    entry[f"{variant}_{sync}_loss_points"] = {
                        "median": round(float(np.median(loss)), 2),
                        "worst": round(float(np.max(loss)), 2),
                        "worst_corpus": sel[int(np.argmax(loss))]["corpus"],
                    }
                entry[f"direct_{sync}_median"] = round(
                    float(np.median([r["direct"][sync] for r in sel])), 4
                )
                entry[f"canonical_{sync}_median"] = round(
                    float(np.median([r["canonical"][sync] for r in sel])), 4
                )
            for variant in ("direct", "canonical", "canonical_consecutive", "bound_no_locality"):
                amp = [r[variant]["amplification"] for r in sel]
                entry[f"{variant}_amplification"] = {
                    "median": round(float(np.median(amp)), 2),
                    "max": round(float(np.max(amp)), 2),
                }
            out.append(entry)
    return out


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    lays = sorted({r["canonical_layout"] for r in rows})
    fig, axes = plt.subplots(1, len(lays), figsize=(6.5 * len(lays), 4.2), squeeze=False)
    for ax, lay in zip(axes[0], lays, strict=True):
        sel = [r for r in rows if r["canonical_layout"] == lay]
        for corpus in sorted({r["corpus"] for r in sel}):
            mine = sorted((r for r in sel if r["corpus"] == corpus), key=lambda r: -r["ranks"])
            x = [str(r["ranks"]) for r in mine]
            loss = [100 * (r["direct"]["microbatch"] - r["canonical"]["microbatch"]) for r in mine]
            ax.plot(x, loss, marker="o", lw=1, label=corpus)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.axhline(-1.0, color="k", ls="--", lw=0.8)
        ax.set_xlabel("physical data-parallel ranks R")
        ax.set_ylabel("direct - canonical efficiency (points, per micro-batch)")
        ax.set_title(f"canonical layout {lay} (V={sel[0]['canonical_ranks']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def run(
    records: int,
    corpora: list[str] | None,
    out: Path,
    layouts: tuple[tuple[int, int], ...] = LAYOUTS,
) -> int:
    rows: list[dict[str, Any]] = []
    for name in corpora or list(text_corpora.NAMES):
        rows.extend(run_corpus(name, records, layouts))
    result: dict[str, Any] = {
        "setting": {
            "pack_size": PACK,
            "window": WINDOW,
            "canonical_grad_accum": G_C,
            "scope": "world",
            "cost_model": "llama3-8b",
            "shard_records": SHARD,
            "record_cap": CAP,
            "layouts": [f"{a}x{b}" for a, b in layouts],
        },
        "target": "canonical within 1 point of direct at R = V, V/2, V/4",
        "summary": summarize(rows),
        "rows": rows,
    }
    write_result(result, out, plot)
    for entry in result["summary"]:
        m = entry["canonical_microbatch_loss_points"]
        s = entry["canonical_step_loss_points"]
        a, d = entry["canonical_amplification"], entry["direct_amplification"]
        print(f"{entry['canonical_layout']} R={entry['ranks']:>3}: loss per micro-batch median "
              f"{m['median']:+.2f} worst {m['worst']:+.2f} ({m['worst_corpus']}); per step "
              f"median {s['median']:+.2f} worst {s['worst']:+.2f}; amplification canonical "
              f"{a['median']:.2f} (max {a['max']:.2f}), direct {d['median']:.2f} "
              f"(max {d['max']:.2f})")  # fmt: skip
    return 0
