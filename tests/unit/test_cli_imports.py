"""``bcl-stream --help``, ``plan``, ``simulate`` and ``inspect`` must not import streaming, torch
or transformers (together ~4-8 s of start-up): checked in a fresh interpreter by looking at
``sys.modules``, once after importing the CLI and those command modules, once after running
the commands on a local dataset. Start-up time itself is measured by
``tools/bench_cli_startup.py``, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_process import python_process

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("streaming", "torch", "transformers", "lightning", "webdataset", "ray")

IMPORTS = """
import json, sys
import bcl_stream.cli
import bcl_stream.commands.plan, bcl_stream.commands.simulate, bcl_stream.commands.inspect
bcl_stream.cli.build_parser()
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""

RUNS = """
import contextlib, io, json, sys
from bcl_stream.cli import main
plan = ["plan", {data!r}, "--world-size", "2", "--pack-size", "4", "--window", "4", "--json"]
with contextlib.redirect_stdout(io.StringIO()):
    codes = [
        main(plan),
        main(["simulate", "--dataset", {data!r}, "--ranks", "2", "--json"]),
        main(["inspect", {data!r}, "--json"]),
    ]
print(json.dumps({{"codes": codes, "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


def run(code: str) -> str:
    proc = python_process(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_cli_and_light_commands_import_no_heavy_library() -> None:
    assert json.loads(run(IMPORTS.format(heavy=HEAVY))) == []


def test_light_commands_run_without_heavy_libraries(mds_dir: Path) -> None:
    result = json.loads(run(RUNS.format(data=str(mds_dir), heavy=HEAVY)))
    assert result == {"codes": [0, 0, 0], "heavy": []}


PREPROCESS = """
import json, sys
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.merge import merge
with open({src!r}, "w") as fh:
    fh.write(json.dumps({{"text": "one record"}}) + "\\n" + json.dumps({{"text": "two"}}) + "\\n")
preprocess([{src!r}], {out!r}, progress=False, part="0/2")
preprocess([{src!r}], {out!r}, progress=False, part="1/2")
merge({out!r})
print(json.dumps("ray" in sys.modules))
"""


def test_single_machine_preprocess_and_merge_never_import_ray(tmp_path: Path) -> None:
    """Ray is an optional extra: only ``--engine ray`` may import it."""
    code = PREPROCESS.format(src=str(tmp_path / "c.jsonl"), out=str(tmp_path / "out"))
    assert json.loads(run(code)) is False


def test_the_check_sees_a_heavy_import() -> None:
    """The probe itself works: the loader (a torch DataLoader) does pull torch in."""
    code = "import sys, bcl_stream.loading.loader; print('torch' in sys.modules)"
    assert run(code) == "True"


PREPROCESS_HF = """
import contextlib, io, json, sys
from bcl_stream.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    codes = [
        main(["preprocess", {text!r}, "--output", {out!r} + "/text", "--tokenizer", {tok!r},
              "--no-progress"]),
        main(["preprocess", {chat!r}, "--output", {out!r} + "/chat", "--tokenizer", {tok!r},
              "--no-progress"]),
        main(["preprocess", {chat!r}, "--output", {out!r} + "/tagged", "--tokenizer", {tagged!r},
              "--no-progress"]),
        main(["preprocess", {chat!r}, "--output", {out!r} + "/wds", "--tokenizer", {tok!r},
              "--format", "wds", "--no-progress"]),
    ]
print(json.dumps({{"codes": codes, "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


def test_preprocess_with_a_tokenizer_directory_imports_no_heavy_library(tmp_path: Path) -> None:
    """``preprocess`` of text and of conversations with a Hugging Face tokenizer directory to
    local MDS and WebDataset: the tokenizer through the ``tokenizers`` library, the chat
    template rendered in our Jinja environment, the shards written without streaming or
    webdataset. torch, transformers, streaming and webdataset (3-7 s of CPU each on this
    machine) are never imported in the process."""
    from tests.hf_tokenizers import LLAMA3, LLAMA3_GENERATION, build_tokenizer_dir

    text, chat = tmp_path / "text.jsonl", tmp_path / "chat.jsonl"
    text.write_text(json.dumps({"text": "one record"}) + "\n" + json.dumps({"text": "two"}))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox"}]
    chat.write_text(json.dumps({"messages": messages}) + "\n")
    code = PREPROCESS_HF.format(
        text=str(text),
        chat=str(chat),
        out=str(tmp_path / "out"),
        tok=str(build_tokenizer_dir(tmp_path / "plain", LLAMA3)),
        tagged=str(build_tokenizer_dir(tmp_path / "tagged", LLAMA3_GENERATION)),
        heavy=HEAVY,
    )
    assert json.loads(run(code)) == {"codes": [0, 0, 0, 0], "heavy": []}
