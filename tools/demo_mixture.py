"""Mixture demo: three ordered streams mixed 0.5/0.3/0.2, trained on 2 CPU DDP ranks.

1. The stdlib corpus (Python functions with docstrings, as chat records) is written module by
   module and cut into three streams by module name (a-h, i-p, q-z): ordered sources, each a
   costed MDS dataset under ``results/demo_mixture/work``.
2. ``python -m lightning_module fit --config configs/mixture.yaml`` trains TinyGPT for one
   epoch; ``PackLogger`` writes each record's stream.
3. The report (``results/demo_mixture/report.json``) gives each stream's share of the epoch and
   the worst share inside any window of W*B*R records, against the requested proportions,
   and the balance of the packs' estimated costs.

    python tools/demo_mixture.py      # about a minute after installation
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bcl_bench import demos
from bcl_bench.harness import ROOT, write_result
from bcl_stream.preprocess import preprocess

OUT, WORK = demos.demo_dirs("demo_mixture")
CONFIG = ROOT / "configs" / "mixture.yaml"
SPLITS = {"a_h": ("a", "h"), "i_p": ("i", "p"), "q_z": ("q", "z")}


def build_streams(records: int) -> dict[str, int]:
    """The stdlib corpus cut into the three streams by module name; records per stream."""
    corpus, _ = demos.stdlib_corpus(WORK, records)
    parts: dict[str, list[str]] = {name: [] for name in SPLITS}
    for line in corpus.read_text(encoding="utf-8").splitlines():
        first = json.loads(line)["source"][:1].lower()
        name = next((n for n, (lo, hi) in SPLITS.items() if lo <= first <= hi), "q_z")
        parts[name].append(line)
    for name, lines in parts.items():
        jsonl = WORK / f"{name}.jsonl"
        jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
        preprocess([str(jsonl)], str(WORK / name), format="mds", cost_model="tinygpt",
                   max_record_tokens=1024, outliers="truncate", overwrite=True, progress=False)  # fmt: skip
    return {name: len(lines) for name, lines in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2400, help="stdlib records in all")
    args = parser.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    sizes = build_streams(args.records)
    logs = WORK / "logs"
    for old in logs.glob("packs_rank*.jsonl"):
        old.unlink()
    demos.fit(CONFIG, WORK / "fit.log", "--trainer.enable_progress_bar", "false", threads=1)
    cfg = yaml.safe_load(CONFIG.read_text())
    data = cfg["data"]
    world = int(cfg["trainer"]["devices"])
    lines = demos.rank_logs(logs, world)
    want = np.array([s["proportion"] for s in data["streams"]], dtype=np.float64)
    want /= want.sum()
    streams = np.array([[line["streams"] for line in rank] for rank in lines])  # (R, steps, B)
    costs = np.array([[line["est_cost"] for line in rank] for rank in lines])
    window = int(data["plan"]["window"])
    worst = 0.0
    for k in range(streams.shape[1] // window):
        got = np.bincount(streams[:, k * window : (k + 1) * window].ravel(), minlength=3)
        worst = max(worst, float(np.abs(got / got.sum() - want).max()))
    epoch = np.bincount(streams.ravel(), minlength=3) / streams.size
    report: dict[str, Any] = {
        "streams": [
            {
                "path": s["path"],
                "records": sizes[Path(s["path"]).name],
                "requested": float(w),
                "epoch_share": float(e),
            }
            for s, w, e in zip(data["streams"], want, epoch, strict=True)
        ],
        "window_share_error_max": worst,
        "steps": int(streams.shape[1]),
        "estimated_efficiency": float(costs.mean(axis=0).sum() / costs.max(axis=0).sum()),
        "config": str(CONFIG.relative_to(ROOT)),
    }
    print(json.dumps(write_result(report, OUT / "report.json"), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
