"""The token contract's epoch tail on many ranks: the step intake as the budget aims it against
the intake evened so the epoch divides into whole steps (``token_contract.even_steps``).

For each corpus of ``bcl_bench/text_corpora.py`` (write order, records capped at 8,192 tokens,
repeated to ``--records``), bcl-world under ``contract="tokens"``, T = 16,384, G = 4, llama3-8b,
at ``--nodes`` x ``--ranks-per-node``: micro-batches per rank (equal on every rank), the records
no rank reads (the epoch tail plus any over budget), fill (mean micro-batch tokens / T) and
efficiency (per micro-batch index, the ranks' mean cost over their largest, summed over the
epoch). ``aimed``: the streams built with ``token_geometry`` alone (the plan before evening);
``evened``: ``build_token_streams``, what readers, ``plan_epoch`` and the simulator plan.

    python tools/bench_token_tail.py            # 64 x 8, 1M records, five corpora
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench import text_corpora
from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_stream.analysis.sim import SimConfig, plan_config, shard_table
from bcl_stream.cost import get_preset
from bcl_stream.planner import build_node_streams, build_token_streams
from bcl_stream.planner.node_streams import NodeStreams
from bcl_stream.planner.token_contract import EMPTY, TokenWalker, plan_tokens, token_geometry

T, CAP, ACCUM = 16_384, 8192, 4
CORPORA = ("man", "code:networkx", "code:torch", "changelogs", "stdlib_chat")


def figures(
    streams: NodeStreams, costs: np.ndarray, tok: np.ndarray, walker: TokenWalker
) -> dict[str, Any]:
    """One plan's figures (module docstring)."""
    packs, dropped = plan_tokens(walker)
    real = packs != EMPTY
    ids = np.where(real, packs, 0)
    load = np.where(real, costs[ids], 0.0).sum(axis=2)  # (ranks, micro-batches)
    used_tokens = np.where(real, tok[ids], 0).sum(axis=2)
    tail = sum(streams.tail(n).size for n in range(len(streams.nodes)))
    n = tok.size
    return {
        "micro_batches_per_rank": int(packs.shape[1]),
        "records_per_step": int(streams.config.pack_size),
        "epoch_tail": int(tail),
        "over_token_budget": int(dropped.size),
        "records_left_share": (tail + dropped.size) / n,
        "fill": float(used_tokens.mean() / T),
        "max_tokens": int(used_tokens.max()),
        "efficiency": float(load.mean(axis=0).sum() / load.max(axis=0).sum()),
    }


def run_corpus(name: str, records: int, nodes: int, per_node: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    tok = text_corpora.build(name, records, CAP)
    costs = get_preset("llama3-8b").cost(tok)
    config = SimConfig(
        ranks=nodes * per_node, ranks_per_node=per_node, grad_accum=ACCUM, shard_records=4096,
        contract="tokens", max_tokens=T,
    )  # fmt: skip
    table = shard_table(tok, costs, config.shard_records)
    planner = plan_config(config, "world")
    aimed = token_geometry(planner, tok, table.counts.size)
    plain = build_node_streams(costs, table, aimed, seed=0, epoch=0, tokens=tok)
    evened = build_token_streams(costs, table, planner, seed=0, epoch=0, tokens=tok)
    row = {
        "corpus": name,
        "held_out": name in text_corpora.HELD_OUT,
        "aimed": figures(plain, costs, tok, TokenWalker(plain, costs, tok, planner)),
        "evened": figures(evened, costs, tok, TokenWalker(evened, costs, tok, planner)),
    }
    row["seconds"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, RESULTS / "bench_token_tail_64x8.json")
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    args = parser.parse_args(argv)
    rows = []
    for name in args.corpora:
        row = run_corpus(name, args.records, args.nodes, args.ranks_per_node)
        a, e = row["aimed"], row["evened"]
        print(
            f"{name}: left {a['records_left_share']:.2%} -> {e['records_left_share']:.2%}, "
            f"micro-batches per rank {a['micro_batches_per_rank']} -> "
            f"{e['micro_batches_per_rank']}, fill {a['fill']:.3f} -> {e['fill']:.3f}, "
            f"efficiency {a['efficiency']:.4f} -> {e['efficiency']:.4f}",
            flush=True,
        )
        rows.append(row)
    settings = {
        "max_tokens": T, "record_cap": CAP, "grad_accum": ACCUM, "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node, "records": args.records, "scope": "world",
        "cost_model": "llama3-8b",
    }  # fmt: skip
    write_result({"settings": settings, "rows": rows}, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
