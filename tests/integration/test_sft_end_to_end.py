"""From raw chat JSONL to a 2-rank DDP fit of a Hugging Face model with assistant-only loss, as
a user runs it (docs/sft.md): a tokenizer directory with a Llama-3-like chat template (its
assistant turns in ``{% generation %}``), one ``bcl-stream preprocess``, one
``python -m lightning_module fit`` of a tiny random ``LlamaForCausalLM`` through
``HFCausalLM``. Checks: the run ends cleanly on both ranks, every batch trains exactly the
assistant tokens the template marks (``return_assistant_tokens_mask``), and every micro-batch
of an optimizer step carries that step's trained tokens over both ranks."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_process import bcl_stream_cli, run_module
from hf_tokenizers import LLAMA3_GENERATION, build_tokenizer_dir

from tests.hf_models import tiny_llama_dir

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

WORDS = " ".join(
    [
        "the quick brown fox jumps over the lazy dog packages are balanced so that every rank",
        "finishes its step at the same time what is the capital of France Paris",
    ]
).split(" ")


def text(k: int, i: int) -> str:
    """k words, starting at a place that depends on the conversation i."""
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(k))


def conversations(n: int) -> list[dict[str, object]]:
    out = []
    for i in range(n):
        messages = [
            {"role": "system", "content": "A helpful assistant."},
            {"role": "user", "content": text(3 + i % 9, i)},
            {"role": "assistant", "content": text(4 + (i * 5) % 23, i)},
        ]
        if i % 3 == 0:  # a second exchange: both assistant turns are trained
            messages += [
                {"role": "user", "content": text(2 + i % 4, i)},
                {"role": "assistant", "content": text(3 + i % 6, i)},
            ]
        out.append({"messages": messages})
    return out


def doc_config() -> dict[str, Any]:
    """The first yaml block of docs/sft.md (the page's ``sft.yaml``), parsed."""
    from doc_blocks import ROOT, fenced_blocks

    (_, first), *_ = fenced_blocks((ROOT / "docs" / "sft.md").read_text(encoding="utf-8"), {"yaml"})
    config: dict[str, Any] = yaml.safe_load(first)
    return config


def test_preprocess_then_ddp_fit_of_a_hugging_face_model_on_assistant_tokens(
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer

    tok_dir = build_tokenizer_dir(tmp_path / "tokenizer", LLAMA3_GENERATION)
    chats = conversations(40)
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps(c) + "\n" for c in chats))
    out = tmp_path / "mds"
    run = bcl_stream_cli(
        "preprocess", str(source), "--output", str(out), "--tokenizer", str(tok_dir)
    )
    assert run.returncode == 0, run.stderr[-3000:]

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    model_dir = tmp_path / "model"
    tiny_llama_dir(
        model_dir, vocab_size=len(tokenizer), max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    # docs/sft.md's sft.yaml as the page shows it: the paths and the steps changed; a seed, the
    # model's attention and learning rate and the test's logging added
    config = doc_config()
    assert config["data"]["data"] == "data/sft" and config["trainer"]["devices"] == 2
    config["seed_everything"] = 0
    config["data"]["data"] = str(out)
    config["model"]["init_args"].update({"model": str(model_dir), "attention": "sdpa", "lr": 1e-3})
    config["trainer"].update({
        "max_steps": 4, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
        "default_root_dir": str(tmp_path / "run"),
        "callbacks": [{
            "class_path": "lightning_module.callbacks.PackLogger",
            "init_args": {"directory": str(tmp_path / "logs"), "fresh": True},
        }],
    })  # fmt: skip
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    fit = run_module("lightning_module", "fit", "--config", str(path), timeout=240)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "loss normalization: step_loss_tokens from the plan" in fit.stdout + fit.stderr

    def assistant_tokens(chat: dict[str, object]) -> int:
        """Targets the template marks: assistant-mask positions t >= 1."""
        got = tokenizer.apply_chat_template(
            chat["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return sum(got["assistant_masks"][1:])

    steps: dict[int, list[dict[str, object]]] = defaultdict(list)
    for rank in range(2):
        lines = [json.loads(x) for x in (tmp_path / "logs" / f"packs_rank{rank}.jsonl").open()]
        assert len(lines) == 8  # 4 optimizer steps of 2 micro-batches
        for line in lines:
            want = sum(assistant_tokens(chats[i]) for i in line["sample_ids"])
            assert 0 < line["loss_tokens"] == want < line["tokens"]
            steps[line["step"]].append(line)
    assert sorted(steps) == [0, 1, 2, 3]
    for lines in steps.values():
        assert len(lines) == 4
        assert {x["step_loss_tokens"] for x in lines} == {sum(x["loss_tokens"] for x in lines)}
