"""How many steps and timing rounds ``tools/bench_measured.py`` needs: re-score a run's every timing.

``bench_measured.py --times-out FILE`` keeps every distinct pack's timing per round and every
strategy's packs. This script re-scores that run with the first 8, 16, 24 and 32 steps and with
each choice of rounds (one round alone, disjoint pairs of rounds as two independent runs, the
first three, all) and with the minimum or the median over those rounds, and prints, per line,
every strategy's efficiency with its 95% bootstrap interval over steps, the intervals of
``bcl-world`` over ``verl_kk`` and ``verl_kk`` over ``nemo_mffd``, and the ordering of the three.
docs/measured.md chose the quick settings from the pilot it prints for
``results/bench_measured_pilot_times.json``:

    python tools/measured_noise.py results/bench_measured_pilot_times.json --max-len 1024
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.corpora import stdlib_lengths
from bcl_bench.measured_stats import as_matrix, bootstrap_steps, efficiency

ORDERED = ("bcl-world", "verl_kk", "nemo_mffd")
SHOWN = ("sequential", "nemo_mffd", "verl_kk", "hf_rebalance", "bcl-world")


def choices(rounds: int) -> list[tuple[str, tuple[int, ...], Callable[..., Any]]]:
    """(label, rounds kept, estimator) for every choice the pilot compares."""
    out: list[tuple[str, tuple[int, ...], Callable[..., Any]]] = [
        (f"round {r}", (r,), np.min) for r in range(min(rounds, 2))
    ]
    out += [(f"min {a},{a + 1}", (a, a + 1), np.min) for a in range(0, rounds - 1, 2)]
    if rounds >= 3:
        out += [("min 0-2", (0, 1, 2), np.min), ("median 0-2", (0, 1, 2), np.median)]
    if rounds > 3:
        out.append((f"min 0-{rounds - 1}", tuple(range(rounds)), np.min))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("times", help="a bench_measured.py --times-out file")
    p.add_argument("--max-len", type=int, default=4096, help="the run's --max-len")
    p.add_argument("--n-boot", type=int, default=1000)
    args = p.parse_args(argv)
    dump = json.loads(Path(args.times).read_text())
    times = {tuple(k): np.array(v) for k, v in dump["packs"]}
    plans = {n: [[tuple(k) for k in r] for r in ranks] for n, ranks in dump["plans"].items()}
    names = [n for n in SHOWN if n in plans]
    rounds = len(next(iter(times.values())))
    lows = np.array([v.min() for v in times.values()])
    spread = np.array([(v.max() - v.min()) / v.min() for v in times.values()])
    medians = np.array([np.median(v) for v in times.values()])
    tokens = np.minimum(stdlib_lengths("cl100k"), args.max_len)
    mean_tokens = np.mean([tokens[list(k)].sum() for k in times])
    print(f"{len(times)} packs, {rounds} rounds, mean {mean_tokens:.0f} tokens and "
          f"{lows.mean():.4f} s (minimum) per pack")  # fmt: skip
    print(f"per pack: median over rounds / minimum - 1 = {np.median(medians / lows - 1):.3f} "
          f"(median), largest / smallest - 1 = {np.median(spread):.3f}")  # fmt: skip
    steps_max = min(max(len(r) for r in ranks) for ranks in plans.values())
    for steps in (s for s in (8, 16, 24, 32) if s <= steps_max):
        for label, kept, estimate in choices(rounds):
            m = {
                n: as_matrix([[float(estimate(times[k][list(kept)])) for k in r[:steps]] for r in plans[n]])
                for n in names
            }  # fmt: skip
            boot = bootstrap_steps(m, n_boot=args.n_boot)
            eff = {n: efficiency(m[n]) for n in names}
            cells = " ".join(
                f"{n} {eff[n]:.3f} [{boot.efficiency[n][0]:.3f}, {boot.efficiency[n][1]:.3f}]"
                for n in names
            )
            bw = boot.speedup[("bcl-world", "verl_kk")]
            vn = boot.speedup[("verl_kk", "nemo_mffd")]
            order = " > ".join(sorted(ORDERED, key=lambda n: -eff[n]))
            print(f"steps {steps:2d} {label:10s} {cells} | bcl-world/verl_kk [{bw[0]:.3f}, "
                  f"{bw[1]:.3f}] verl_kk/nemo_mffd [{vn[0]:.3f}, {vn[1]:.3f}] | {order}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
