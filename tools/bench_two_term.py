"""Speed of the two-term refinement (``planner/two_term.py``): microseconds per record, beside
the plan it refines.

The readers refine every batch of windows they plan, so the refinement must cost well under
the planning itself. Data: ``tools/bench_vlm.py``'s held-out workloads (COCO val2017 image
sizes; ``sft`` and ``mix``), qwen2-vl-2b training FLOPs, 1 node x 8 ranks, G = 4, under the
record contract (B = 8) and the token budget (T = 16,384, image tokens included). Per cell,
the median of ``--repeats`` runs on one process:

- ``plan_us_per_record``: bcl-world's plan of the language term (the simulator's path, the
  same planner the readers walk: they plan that term, then refine);
- ``refine_us_per_record``: ``refine_two_terms`` on that plan as the readers run it (the
  ``guarded`` rule: the plan, three regroupings and the redeal of each window, each refined by
  free swaps, and its window swaps, refined by capped ones, chosen under the guard of 16-window
  units; repaired or capped where a unit fails);
- ``in_place_us_per_record``: the ``in_place`` rule alone (no regrouping; free swaps, capped
  again for a node whose free swaps left either term worse balanced), the node's whole plan one
  unit, as the reference below decides;
- ``reference_us_per_record``: the first implementation of ``in_place``, one swap and one
  micro-batch per numpy call (``tests/two_term_reference.py``), timed once;
  ``same_swaps_as_reference`` says whether it and ``in_place`` returned the same plan.

    python tools/bench_two_term.py          # results/bench_two_term.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.harness import RESULTS, ROOT, bench_parser, parse_or_print_table, write_result
from bcl_stream.analysis.sim import plan_schedules, shard_table
from bcl_stream.planner.token_contract import planning_window
from bcl_stream.planner.two_term import GUARD_WINDOWS, ITERATIONS, refine_two_terms
from bcl_stream.vision.cost import get_two_term_preset
from tools.bench_vlm import settings, workload

WORKLOADS = ("sft", "mix")
COST_MODEL = "qwen2-vl-2b"


def cell(name: str, label: str, records: int, repeats: int) -> dict[str, Any]:
    """Times of one workload under one setting."""
    sys.path.insert(0, str(ROOT / "tests"))  # the test helpers' own import root
    from two_term_reference import reference_refine

    config = settings()[label]
    data = workload(name, "held_out", records)
    vision, language = get_two_term_preset(COST_MODEL).terms(data)
    tok = data.tokens
    budget = config.contract == "tokens"
    kwargs: dict[str, Any] = {
        "tokens": tok if budget else None,
        "max_tokens": config.max_tokens if budget else None,
    }
    window = planning_window(config)  # the readers'
    plan_s, refine_s, in_place_s = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        table = shard_table(tok, language, config.shard_records)
        packs = plan_schedules(tok, language, table, config, ("bcl-world",))["bcl-world"].packs
        t1 = time.perf_counter()
        got = refine_two_terms(
            packs, vision, language, config.ranks_per_node, window=window,
            guard_windows=GUARD_WINDOWS, **kwargs,
        )  # fmt: skip
        t2 = time.perf_counter()
        alone = refine_two_terms(
            packs, vision, language, config.ranks_per_node, rule="in_place", **kwargs
        )
        t3 = time.perf_counter()
        plan_s.append(t1 - t0)
        refine_s.append(t2 - t1)
        in_place_s.append(t3 - t2)
    t0 = time.perf_counter()
    want = reference_refine(packs, vision, language, config.ranks_per_node, **kwargs)
    reference = time.perf_counter() - t0
    planned = sum(int(np.asarray(p).size) for rank in got for p in rank)
    same = [[p.tolist() for p in r] for r in alone] == [[p.tolist() for p in r] for r in want]
    micro = sum(len(rank) for rank in got) // config.ranks
    return {
        "workload": name,
        "setting": label,
        "records_planned": planned,
        "micro_batches_per_rank": micro,
        "plan_us_per_record": 1e6 * statistics.median(plan_s) / planned,
        "refine_us_per_record": 1e6 * statistics.median(refine_s) / planned,
        "in_place_us_per_record": 1e6 * statistics.median(in_place_s) / planned,
        "reference_us_per_record": 1e6 * reference / planned,
        "refine_over_plan": statistics.median(refine_s) / statistics.median(plan_s),
        "same_swaps_as_reference": same,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table docs/vlm.md carries."""
    lines = [
        "| workload | setting | plan, us/record | refinement, us/record | in place, us/record "
        "| first implementation of in place, us/record | refinement / plan | in place: same "
        "swaps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['setting']} | {r['plan_us_per_record']:.1f} "
            f"| {r['refine_us_per_record']:.1f} | {r['in_place_us_per_record']:.1f} "
            f"| {r['reference_us_per_record']:.1f} "
            f"| {r['refine_over_plan']:.2f} | {'yes' if r['same_swaps_as_reference'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_two_term.json")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_or_print_table(parser, argv, markdown)
    if args is None:
        return 0
    rows = []
    for name in WORKLOADS:
        for label in settings():
            rows.append(cell(name, label, args.records, args.repeats))
            r = rows[-1]
            print(
                f"{name:4s} {label:14s} plan {r['plan_us_per_record']:.1f} us/rec, refine "
                f"{r['refine_us_per_record']:.1f}, in place {r['in_place_us_per_record']:.1f}, "
                f"reference {r['reference_us_per_record']:.1f}, same {r['same_swaps_as_reference']}",
                flush=True,
            )
    result = {
        "settings": {
            "cost_model": COST_MODEL,
            "records": args.records,
            "repeats": args.repeats,
            "iterations": ITERATIONS,
            "half": "held_out",
        },
        "rows": rows,
    }
    write_result(result, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
