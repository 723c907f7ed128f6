"""What the model's chat template and loss masks cost at preprocessing.

One synthetic chat corpus (a system turn, 1-4 user/assistant exchanges of 5-200 words each),
preprocessed in one process (``--workers 1``: the per-record cost, not the pool) with:

- ``cl100k`` and the built-in ChatML (masks from the rendering's character ranges);
- a Hugging Face tokenizer directory whose template marks assistant turns with
  ``{% generation %}`` (masks from ``return_assistant_tokens_mask``);
- the same rendering without the tags (masks found by rendering: each turn's prefixes
  rendered for the first record of each conversation structure, then the structure's
  skeleton, ``text/turn_skeleton.py``, checked against the one full rendering);
- the same directory under ``--loss-on all`` (no mask: the template and tokenizer alone).

Then, with the Hugging Face directory (the mask found by rendering):

- **start-up**: ``python -m bcl_stream.cli preprocess`` of a one-record file, as a user runs it
  (a fresh process: imports, tokenizer, writer, one record, the cost index), MDS and
  WebDataset output, the median of ``--repeats`` runs after one that writes the bytecode
  cache; beside it the import of ``streaming``, ``webdataset`` and ``transformers``' tokenizer
  in fresh processes (what the start-up cost before they left the preprocess path);
- **workers**: the same corpus preprocessed with ``--workers`` 1, 2 and 4 (MDS output), with
  the Hugging Face directory and with cl100k: records per second over the whole call, and
  the CPU seconds of the main process and of the workers per record (the pool's processes
  are reaped at its end, so their CPU is counted), also less each worker's start-up (measured
  on a pool given no work). The corpus is below the size under which
  ``preprocess`` keeps to one process (``SMALL_INPUT_BYTES``); that rule is switched off here
  so the pool is really measured;
- **mask ratio**: encoding every record (chat template, tokenizer and mask) against a bare
  ``apply_chat_template(messages, tokenize=True)`` loop over the same messages with the same
  template and tokenizer, in this process, best of ``--repeats`` each in wall-clock and in
  CPU seconds (interleaved; each
  run starts with no skeleton built, as a fresh ``preprocess`` does): the
  prefix-stable test template (mask by rendering), its ``{% generation %}`` copy, Qwen3's
  official template (recognised by its hash: its tagged variant) and a copy of it whose hash
  is unknown (not prefix-stable: turns located on the full rendering).

The tokenizer directories are the test suite's (``tests/hf_tokenizers.py``: a small byte-level
BPE trained on the spot, Llama-3-like special tokens), so token counts are not a real model's;
the figure that carries over is the time per record of each way of finding the mask, relative
to the unmasked rendering. Writes ``results/bench_sft_preprocess.json`` with the machine's CPU
count and load average: on a shared machine the wall-clock figures move with the load.

    python -m tools.bench_sft_preprocess [--records 3000]   # from the checkout's root
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bcl_bench.harness import RESULTS, ROOT, bench_parser, checkout_env, machine_stamp, write_result
from bcl_bench.writing import timed_preprocess
from bcl_stream.preprocess import preprocess
from bcl_stream.records.source import RecordSource


def corpus(path: Path, n: int, seed: int = 0) -> None:
    """``n`` chat records (1-4 exchanges, user turns of 5-59 words, assistant turns of 10-199)
    as JSON lines: the test suite's ``word_chats`` (``main`` has checked that the suite's
    helpers import)."""
    from tests.sft_records import word_chats

    chats = word_chats(n, seed, exchanges=(1, 5), user_words=(5, 60), assistant_words=(10, 200))
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in chats))


def _seconds(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a fresh process running ``command`` (it must succeed); CPU is
    user + system of the process and its children, what a load on the machine does not
    inflate."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def startup(tmp: Path, tokenizer: str, repeats: int) -> dict[str, Any]:
    """Median wall and CPU seconds of a one-record ``preprocess`` (MDS, WebDataset) and of the
    imports that bound the old start-up from below, each in fresh processes.

    Bytecode is cached as for an installed package (``PYTHONPYCACHEPREFIX`` in the temporary
    directory, written by a first run that is not counted): with ``PYTHONDONTWRITEBYTECODE``
    every process would compile its sources again (about 0.7 s here), which no installed
    package does."""
    one = tmp / "one.jsonl"
    corpus(one, 1)
    python = [sys.executable]
    env = checkout_env(PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    runs: dict[str, list[tuple[float, float]]] = {}
    for repeat in range(repeats + 1):
        for fmt in ("mds", "wds"):
            command = [
                *python, "-m", "bcl_stream.cli", "preprocess", str(one), "--output",
                str(tmp / f"one-{fmt}"), "--format", fmt, "--tokenizer", tokenizer,
                "--overwrite", "--no-progress",
            ]  # fmt: skip
            seconds = _seconds(command, env)
            if repeat:  # the first run writes the bytecode cache
                runs.setdefault(f"preprocess_one_record_{fmt}", []).append(seconds)
        for name, module in (
            ("import_streaming", "import streaming"),
            ("import_webdataset", "import webdataset"),
            ("import_transformers_tokenizer", "from transformers import AutoTokenizer"),
        ):
            seconds = _seconds([*python, "-c", module], env)
            if repeat:
                runs.setdefault(name, []).append(seconds)
    out: dict[str, Any] = {"repeats": repeats, "bytecode_cached": True}
    for name, values in runs.items():
        out[name] = round(statistics.median(v[0] for v in values), 2)
        out[f"{name}_cpu"] = round(statistics.median(v[1] for v in values), 2)
    return out


def workers_scaling(
    tmp: Path, src: Path, tokenizers: dict[str, str], counts: list[int]
) -> list[dict[str, Any]]:
    """Records per second of a whole ``preprocess`` call at each worker count (MDS output),
    under each tokenizer, and the CPU seconds it took: the main process's (reading, writing;
    all of it at 1 worker, which encodes in the main process) and the workers' (counted when
    the pool's processes are reaped at its end). CPU per record per worker staying flat as
    workers are added is scaling the machine's load does not hide; records/s is capped by the
    cores left free. The load average before and after each run is in its row."""
    rows = []
    # spawned workers cache their bytecode as an installed package has it (the first pool
    # writes it): see startup()
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    startup = {t: (_worker_startup(t), _worker_startup(t))[1] for t in tokenizers.values()}
    startup = {label: startup[tokenizer] for label, tokenizer in tokenizers.items()}
    print(json.dumps({"worker_startup_cpu_seconds": startup}))
    for (label, tokenizer), workers in ((t, w) for t in tokenizers.items() for w in counts):
        load = round(os.getloadavg()[0], 2)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = tmp / f"workers{workers}"
        report, wall = timed_preprocess(
            src, out, source=RecordSource(tokenizer=tokenizer), workers=workers
        )  # the pool measured even where preprocess would not start it
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        main = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
        pool = (child1.ru_utime - child0.ru_utime) + (child1.ru_stime - child0.ru_stime)
        n = max(report.records_written, 1)
        started = startup[label] * workers if workers > 1 else 0.0
        rows.append(
            {
                "tokenizer": label,
                "workers": workers,
                "records": report.records_written,
                "seconds_wall": round(wall, 2),
                "records_per_second": round(report.records_written / wall, 1),
                "cpu_seconds_main": round(main, 2),
                "cpu_seconds_workers": round(pool, 2),
                "cpu_ms_per_record": round(1e3 * (main + pool) / n, 3),
                "cpu_ms_per_record_less_worker_startup": round(
                    1e3 * (main + pool - started) / n, 3
                ),
                "load_average_1min": [load, round(os.getloadavg()[0], 2)],
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def _worker_startup(tokenizer: str) -> float:
    """CPU seconds one spawned tokenizer worker spends before its first record (interpreter,
    imports, its tokenizer), from a pool of 2 that is given no work."""
    from bcl_stream.preprocess.work import EncodeOptions, tokenizer_pool

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tokenizer_pool(2, EncodeOptions(RecordSource(tokenizer=tokenizer))) as pool:
        pool.close()  # no work: each worker starts, then exits on the pool's sentinel
        pool.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(cpu / 2, 3)


def mask_ratio(
    src: Path, templates: dict[str, tuple[str, str | None]], repeats: int
) -> dict[str, Any]:
    """Seconds to encode every record (template, tokenizer, mask) against a bare
    ``apply_chat_template(tokenize=True)`` loop with the same template and tokenizer, best of
    ``repeats``, interleaved; ``templates``: name -> (tokenizer directory, template file or
    None for the directory's own)."""
    from bcl_stream.records.registry import encode as encode_shape
    from bcl_stream.text.chat import Conversation
    from bcl_stream.text.hf_dir import read_chat_template
    from bcl_stream.text.templates import Encoder
    from bcl_stream.text.tokenizers import load_hf_tokenizer
    from bcl_stream.text.turn_skeleton import Skeletons

    chats = [json.loads(line)["messages"] for line in src.read_text().splitlines()]
    runs: dict[str, Any] = {}
    for name, (directory, template_file) in templates.items():
        tok = load_hf_tokenizer(directory)
        template = tok.chat_template if template_file is None else read_chat_template(template_file)
        encoder = Encoder(directory, chat_template=template_file)

        def bare(tok: Any = tok, template: str = template) -> None:
            for messages in chats:
                tok.apply_chat_template(messages, tokenize=True, chat_template=template)

        def encode(encoder: Encoder = encoder) -> None:
            encoder.skeletons = Skeletons()  # none built yet, as in a fresh preprocess
            for messages in chats:
                encode_shape(Conversation(messages), encoder)

        runs[name] = {"mask": "generation" if encoder.generation else "rendering"}
        runs[name]["encoder"] = encoder
        runs[name]["bare_apply_chat_template"] = bare
        runs[name]["bcl_stream"] = encode
    best: dict[str, dict[str, float]] = {name: {} for name in runs}
    cpu: dict[str, dict[str, float]] = {name: {} for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            for key in ("bare_apply_chat_template", "bcl_stream"):
                t0, c0 = time.perf_counter(), time.process_time()
                run[key]()
                best[name][key] = min(best[name].get(key, float("inf")), time.perf_counter() - t0)
                cpu[name][key] = min(cpu[name].get(key, float("inf")), time.process_time() - c0)
    return {
        "records": len(chats),
        "repeats": repeats,
        "templates": {
            name: {
                "mask": runs[name]["mask"],
                "seconds_best": {k: round(v, 3) for k, v in best[name].items()},
                "ratio_to_bare": round(
                    best[name]["bcl_stream"] / best[name]["bare_apply_chat_template"], 3
                ),
                # the same from CPU seconds (this process's), which waiting for a core on a
                # loaded machine does not inflate
                "cpu_seconds_best": {k: round(v, 3) for k, v in cpu[name].items()},
                "ratio_to_bare_cpu": round(
                    cpu[name]["bcl_stream"] / cpu[name]["bare_apply_chat_template"], 3
                ),
                # of the last run's records: located on a skeleton, not by rendering
                "located_on_skeleton": runs[name]["encoder"].skeletons.located,
            }
            for name in runs
        },
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
            "bench_sft_preprocess builds its tokenizers and corpus with the test suite's "
            "tests/hf_tokenizers.py and tests/sft_records.py: run it from the checkout's root as "
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
                source=RecordSource(tokenizer=tokenizer, loss_on=loss_on),
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
        from tests.official_templates import official, tokenizer_dir

        qwen3 = str(tokenizer_dir(Path(tmp) / "qwen3", "qwen3"))
        copy = Path(tmp) / "qwen3_copy.jinja"  # an unknown hash: no tagged variant is used
        copy.write_text("{# a copy #}" + official("qwen3"), encoding="utf-8")
        ratio = mask_ratio(
            src,
            {
                "llama3-like, prefix-stable": (plain, None),
                "llama3-like, {% generation %}": (generation, None),
                "qwen3 official (tagged variant by hash)": (qwen3, None),
                "qwen3 copy, not prefix-stable": (qwen3, str(copy)),
            },
            args.repeats,
        )
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
