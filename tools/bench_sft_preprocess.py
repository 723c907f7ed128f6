"""What the model's chat template and loss masks cost at preprocessing.

One synthetic chat corpus (a system turn, 1-4 user/assistant exchanges of 5-200 words each),
preprocessed in one process (``--workers 1``: the per-record cost, not the pool) with:

- ``cl100k`` and the built-in ChatML (masks from the rendering's character ranges);
- a Hugging Face tokenizer directory whose template marks assistant turns with
  ``{% generation %}`` (masks from ``return_assistant_tokens_mask``);
- the same rendering without the tags (masks found by rendering each turn's prefixes: two
  extra renderings per assistant turn);
- the same directory under ``--loss-on all`` (no mask: the template and tokenizer alone).

Then, with the Hugging Face directory (the mask found by rendering):

- **start-up**: ``python -m bcl_stream.cli preprocess`` of a one-record file, as a user runs it
  (a fresh process: imports, tokenizer, writer, one record, the cost index), MDS and
  WebDataset output, the median of ``--repeats`` runs; beside it the import of the writer's
  library alone (``streaming``, ``webdataset``) and of ``transformers``' tokenizer, in fresh
  processes too, which bound it from below;
- **workers**: the same corpus preprocessed with ``--workers`` 1, 2 and 4 (MDS output), with
  the Hugging Face directory and with cl100k, records per second over the whole call. The corpus is below the size under which ``preprocess``
  keeps to one process (``SMALL_INPUT_BYTES``); that rule is switched off here so the pool is
  really measured;
- **mask ratio**: encoding every record (chat template, tokenizer and mask) against a bare
  ``apply_chat_template(messages, tokenize=True)`` loop over the same messages with the same
  tokenizer, in this process, best of ``--repeats`` each (interleaved), for the mask found by
  rendering and for the ``{% generation %}`` mask.

The tokenizer directories are the test suite's (``tests/hf_tokenizers.py``: a small byte-level
BPE trained on the spot, Llama-3-like special tokens), so token counts are not a real model's;
the figure that carries over is the time per record of each way of finding the mask, relative
to the unmasked rendering. Writes ``results/bench_sft_preprocess.json`` with the machine's CPU
count and load average: on a shared machine the wall-clock figures move with the load.

    python -m tools.bench_sft_preprocess [--records 3000]   # from the checkout's root
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcl_bench.harness import RESULTS, ROOT, bench_parser, checkout_env, machine_stamp, write_result
from bcl_stream.preprocess import pipeline, preprocess

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


def _seconds(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a fresh process running ``command`` (it must succeed); CPU is
    user + system of the process and its children, what a load on the machine does not
    inflate."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=checkout_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def startup(tmp: Path, tokenizer: str, repeats: int) -> dict[str, Any]:
    """Median wall seconds of a one-record ``preprocess`` (MDS, WebDataset) and of the imports
    that bound it from below, each in fresh processes."""
    one = tmp / "one.jsonl"
    corpus(one, 1)
    python = [sys.executable]
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeats):
        for fmt in ("mds", "wds"):
            command = [
                *python, "-m", "bcl_stream.cli", "preprocess", str(one), "--output",
                str(tmp / f"one-{fmt}"), "--format", fmt, "--tokenizer", tokenizer,
                "--overwrite", "--no-progress",
            ]  # fmt: skip
            runs.setdefault(f"preprocess_one_record_{fmt}", []).append(_seconds(command))
        for name, module in (
            ("import_streaming", "import streaming"),
            ("import_webdataset", "import webdataset"),
            ("import_transformers_tokenizer", "from transformers import AutoTokenizer"),
        ):
            runs.setdefault(name, []).append(_seconds([*python, "-c", module]))
    out: dict[str, Any] = {"repeats": repeats}
    for name, values in runs.items():
        out[name] = round(statistics.median(v[0] for v in values), 2)
        out[f"{name}_cpu"] = round(statistics.median(v[1] for v in values), 2)
    return out


def workers_scaling(
    tmp: Path, src: Path, tokenizers: dict[str, str], counts: list[int]
) -> list[dict[str, Any]]:
    """Records per second of a whole ``preprocess`` call at each worker count (MDS output),
    under each tokenizer."""
    rows = []
    small = pipeline.SMALL_INPUT_BYTES
    pipeline.SMALL_INPUT_BYTES = 0  # measure the pool even where preprocess would not start it
    try:
        for (label, tokenizer), workers in ((t, w) for t in tokenizers.items() for w in counts):
            t0 = time.perf_counter()
            report = preprocess(
                [str(src)],
                str(tmp / f"workers{workers}"),
                tokenizer=tokenizer,
                workers=workers,
                overwrite=True,
                progress=False,
            )
            wall = time.perf_counter() - t0
            rows.append(
                {
                    "tokenizer": label,
                    "workers": workers,
                    "records": report.records_written,
                    "seconds_wall": round(wall, 2),
                    "records_per_second": round(report.records_written / wall, 1),
                }
            )
            print(json.dumps(rows[-1]))
    finally:
        pipeline.SMALL_INPUT_BYTES = small
    return rows


def mask_ratio(src: Path, plain: str, generation: str, repeats: int) -> dict[str, Any]:
    """Seconds to encode every record (template, tokenizer, mask) against a bare
    ``apply_chat_template(tokenize=True)`` loop, best of ``repeats``, interleaved."""
    from bcl_stream.records.registry import encode as encode_shape
    from bcl_stream.text.chat import Conversation
    from bcl_stream.text.templates import Encoder
    from bcl_stream.text.tokenizers import load_hf_tokenizer

    chats = [json.loads(line)["messages"] for line in src.read_text().splitlines()]
    bare_tok = load_hf_tokenizer(plain)
    encoders = {"mask_by_rendering": Encoder(plain), "generation_mask": Encoder(generation)}

    def bare() -> None:
        for messages in chats:
            bare_tok.apply_chat_template(messages, tokenize=True)

    def encode(encoder: Encoder) -> None:
        for messages in chats:
            encode_shape(Conversation(messages), encoder)

    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in (
            ("bare_apply_chat_template", bare),
            *((k, lambda e=e: encode(e)) for k, e in encoders.items()),
        ):
            t0 = time.perf_counter()
            run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    base = best["bare_apply_chat_template"]
    return {
        "records": len(chats),
        "repeats": repeats,
        "seconds_best": {k: round(v, 3) for k, v in best.items()},
        "ratio_to_bare": {k: round(best[k] / base, 3) for k in encoders},
    }


def main() -> None:
    parser = bench_parser(__doc__, RESULTS / "bench_sft_preprocess.json")
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3, help="start-up and mask-ratio runs")
    parser.add_argument("--workers", default="1,2,4", help="worker counts to measure")
    args = parser.parse_args()
    machine = machine_stamp()
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
        started = startup(Path(tmp), plain, args.repeats)
        print(json.dumps({"startup": started}))
        scaling = workers_scaling(
            Path(tmp),
            src,
            {"hf_mask_by_rendering": plain, "cl100k": "cl100k"},
            [int(w) for w in args.workers.split(",")],
        )
        ratio = mask_ratio(src, plain, generation, args.repeats)
        print(json.dumps({"mask_ratio": ratio}))
    write_result(
        {
            "records": args.records,
            "workers": 1,
            "runs": rows,
            "startup_seconds": started,
            "workers_scaling": scaling,
            "mask_ratio": ratio,
        },
        args.out,
        machine=machine,
    )


if __name__ == "__main__":
    main()
