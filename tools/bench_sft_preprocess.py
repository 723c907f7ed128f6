"""What the model's chat template and loss masks cost at preprocessing.

One synthetic chat corpus (a system turn, 1-4 user/assistant exchanges of 5-200 words each),
preprocessed in one process (``--workers 1``: the per-record cost, not the pool) with:

- ``cl100k`` and the built-in ChatML (masks from the rendering's character ranges);
- a Hugging Face tokenizer directory whose template marks assistant turns with
  ``{% generation %}`` (masks from ``return_assistant_tokens_mask``);
- the same rendering without the tags (masks found by rendering each turn's prefixes: two
  extra renderings per assistant turn);
- the same directory under ``--loss-on all`` (no mask: the template and tokenizer alone).

The tokenizer directories are the test suite's (``tests/hf_tokenizers.py``: a small byte-level
BPE trained on the spot, Llama-3-like special tokens), so token counts are not a real model's;
the figure that carries over is the time per record of each way of finding the mask, relative
to the unmasked rendering. Writes ``results/bench_sft_preprocess.json``.

    python -m tools.bench_sft_preprocess [--records 3000]   # from the checkout's root
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_stream.preprocess import preprocess

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "packs",
    "balance",
    "ranks",
    "steps",
    "because",
]


def corpus(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for _ in range(n):
            messages = [{"role": "system", "content": "You are helpful."}]
            for _ in range(int(rng.integers(1, 5))):
                for role, low, high in (("user", 5, 60), ("assistant", 10, 200)):
                    text = " ".join(rng.choice(WORDS, int(rng.integers(low, high))))
                    messages.append({"role": role, "content": text})
            fh.write(json.dumps({"messages": messages}) + "\n")


def main() -> None:
    parser = bench_parser(__doc__, RESULTS / "bench_sft_preprocess.json")
    parser.add_argument("--records", type=int, default=3000)
    args = parser.parse_args()
    try:
        from tests.hf_tokenizers import LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir
    except ImportError as exc:
        raise SystemExit(
            "bench_sft_preprocess builds its tokenizers with the test suite's "
            "tests/hf_tokenizers.py: run it from the checkout's root as "
            "`python -m tools.bench_sft_preprocess`"
        ) from exc

    rows = []
    with tempfile.TemporaryDirectory(prefix="bcl_bench_sft_") as tmp:
        src = Path(tmp) / "chat.jsonl"
        corpus(src, args.records)
        generation = str(build_tokenizer_dir(Path(tmp) / "generation", LLAMA3_GENERATION))
        plain = str(build_tokenizer_dir(Path(tmp) / "plain", LLAMA3))
        runs = [
            ("cl100k, built-in ChatML", "cl100k", "assistant"),
            ("HF template, {% generation %} mask", generation, "assistant"),
            ("HF template, mask by rendering", plain, "assistant"),
            ("HF template, --loss-on all (no mask)", plain, "all"),
        ]
        for name, tokenizer, loss_on in runs:
            t0 = time.perf_counter()
            report = preprocess(
                [str(src)],
                str(Path(tmp) / "out"),
                format="wds",
                tokenizer=tokenizer,
                loss_on=loss_on,
                workers=1,
                overwrite=True,
                progress=False,
            )
            wall = time.perf_counter() - t0
            rows.append(
                {
                    "run": name,
                    "records": report.records_written,
                    "tokens": report.tokens_written,
                    "trained_tokens": report.trained_tokens_written,
                    "seconds_wall": round(wall, 2),
                    "seconds_encode": round(report.seconds_tokenize, 2),
                    "ms_encode_per_record": round(
                        1e3 * report.seconds_tokenize / max(report.records_written, 1), 3
                    ),
                }
            )
            print(json.dumps(rows[-1]))
    write_result({"records": args.records, "workers": 1, "runs": rows}, args.out)


if __name__ == "__main__":
    main()
