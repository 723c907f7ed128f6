"""Corpora for the balance benchmarks from the command line: sample a named length profile,
build the stdlib chat corpus, or list the profiles (``bcl_bench.corpora`` says what they are).

    python tools/corpora.py --profile sharegpt --n 65536 --out lengths.npy
    python tools/corpora.py --stdlib stdlib_chat.jsonl [--limit N]
    python tools/corpora.py --list
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bcl_bench.corpora import DEFAULT_MAX_TOKENS, PROFILES, build_stdlib_corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--profile", choices=sorted(PROFILES), help="sample a named profile")
    mode.add_argument("--stdlib", type=Path, metavar="OUT.jsonl", help="build the stdlib corpus")
    mode.add_argument("--list", action="store_true", help="list the profiles and what they imitate")
    parser.add_argument("--n", type=int, default=65536, help="records to sample (--profile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--limit", type=int, default=None, help="max records (--stdlib)")
    parser.add_argument("--out", type=Path, help="output .npy (--profile)")
    args = parser.parse_args(argv)
    if args.list:
        for p in PROFILES.values():
            print(f"{p.name:<14} {p.imitates}: {p.why}")
        return 0
    if args.stdlib is not None:
        count = build_stdlib_corpus(args.stdlib, limit=args.limit)
        print(f"wrote {count} records to {args.stdlib}")
        return 0
    if args.out is None:
        parser.error("--profile needs --out FILE.npy")
    try:
        lengths = PROFILES[args.profile](args.n, args.seed, max_tokens=args.max_tokens)
    except ValueError as exc:
        parser.error(str(exc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, lengths)
    print(
        f"wrote {lengths.size} lengths to {args.out}: median {np.median(lengths):.0f}, "
        f"mean {lengths.mean():.0f}, p99 {np.percentile(lengths, 99):.0f}, max {lengths.max()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
