"""Image-text records trained through ``BCLDataModule`` and ``HFCausalLM`` (a tiny random
Qwen2-VL built from its config, no download), data made by ``tools/vlm_data.py`` (synthetic
pixels at COCO val2017 sizes, img2dataset layout, text-only records mixed in):

- in one process: on every batch of a fit the module is in training mode (its weights loaded
  with ``from_pretrained``, which returns eval mode) and the batch's summed loss equals its
  records' losses run alone through the plain model (packed rows over MDS, padded rows over
  WebDataset), images included;
- 2 gloo ranks, accumulation 2, one SGD step over the WebDataset copy: the update is minus the
  gradient of one process on the step's records concatenated;
- docs/vlm.md's "Train it" commands, run as written (the data tool in this process, the fit on
  2 DDP ranks over MDS), and a resume from their last mid-epoch checkpoint in a new process: the
  same packs from there on each rank and the same final weights, bit for bit.

What starts processes is kept to what needs them (the suite's budget): two 2-rank fits for the
documented command and its resume, one 2-rank step for the gradient; each format is read on 2
ranks by one of them and checked against records alone in one process by another.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from cli_process import run_module, run_script
from pack_oracles import check_every_record_once
from resume_harness import check_resumed_log

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.collate import IGNORE_INDEX, PackCollate
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.vision.batch import ImageCollate
from bcl_stream.vision.storage import stored_images
from lightning_module.callbacks import read_pack_log
from lightning_module.datamodule import BCLDataModule
from lightning_module.hf_causal_lm import HFCausalLM
from tests.trainers import cpu_trainer
from tools.vlm_data import build

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "step_gradients.py"
pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """processor/, model/, source/, mds/ and wds/ (the same records) under one directory."""
    out = tmp_path_factory.mktemp("vlm_train")
    build(out, records=32, fmt="mds", text_every=4)
    sources = sorted(str(p) for p in (out / "source").iterdir())
    preprocess(sources, str(out / "wds"), format="wds", processor=str(out / "processor"),
               progress=False)  # fmt: skip
    return out


def records_by_id(data: Path) -> dict[int, dict[str, Any]]:
    """Every stored record of ``data``, by sample id (read one by one, no collate)."""
    reader = WDSPackDataset if read_index(data).format == "wds" else MDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=1)
    return {r["sample_id"]: r for pack in PackLoader(reader(data, config, 0)) for r in pack}


def alone(model: torch.nn.Module, records: list[dict[str, Any]], collate: ImageCollate) -> tuple:
    """(summed cross-entropy, trained tokens) of ``records``, each run alone through the plain
    Hugging Face model: one row, no mask, no positions given (the model's own), its images."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    for record in records:
        one = collate([record])
        logits = model(
            input_ids=one["input_ids"],
            pixel_values=one.get("pixel_values"),
            image_grid_thw=one.get("image_grid_thw"),
        ).logits[0]
        labels = one["labels"][0, 1:]  # Hugging Face's convention: logits[t] predicts t + 1
        loss = F.cross_entropy(logits[:-1].float(), labels, ignore_index=IGNORE_INDEX,
                               reduction="sum")  # fmt: skip
        total, count = total + loss.double(), count + int((labels != IGNORE_INDEX).sum())
    return total, count


def single_collate(work: Path, data: Path) -> ImageCollate:
    base = PackCollate.for_dataset(read_index(data), None, "padded", labels="unshifted")
    return ImageCollate(base, str(work / "processor"))


@pytest.mark.parametrize(("collate", "fmt"), [("packed", "mds"), ("padded", "wds")])
def test_a_fit_trains_in_training_mode_and_each_batch_loss_is_its_records_alone(
    work: Path, tmp_path: Path, collate: str, fmt: str
) -> None:
    HFCausalLM(str(work / "model")).model.save_pretrained(tmp_path / "weights")
    module = HFCausalLM(str(tmp_path / "weights"), attention="sdpa", lr=1e-3)
    records = records_by_id(work / fmt)
    one = single_collate(work, work / fmt)
    seen: list[dict[str, Any]] = []

    class Watch(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, i) -> None:  # type: ignore[no-untyped-def]
            with torch.no_grad():
                packed, count = module.loss_sum(batch)
                ids = batch["sample_ids"].tolist()
                want, want_count = alone(module.model, [records[j] for j in ids], one)
            seen.append({
                "modes": {m.training for m in module.modules()},
                "images": int(batch["image_counts"].sum()),
                "pixels": "pixel_values" in batch,
                "loss": (float(packed), float(want)),
                "count": (int(count), want_count),
            })  # fmt: skip

    dm = BCLDataModule(
        str(work / fmt),
        plan={"pack_size": 4, "window": 2},
        batch={"collate": collate, "labels": "unshifted", "processor": str(work / "processor")},
        loader={"num_workers": 1},  # images decoded in the worker
    )
    trainer = cpu_trainer(max_steps=4, callbacks=[Watch()], default_root_dir=str(tmp_path))
    trainer.fit(module, dm)
    assert len(seen) == 4
    assert any(row["images"] for row in seen)
    for row in seen:
        assert row["modes"] == {True}  # every module, the HF model's included
        assert row["pixels"] == (row["images"] > 0)
        assert row["count"][0] == row["count"][1] > 0
        assert row["loss"][0] == pytest.approx(row["loss"][1], rel=1e-5)


def test_two_ranks_step_gradient_equals_one_process_on_the_whole_step(
    work: Path, tmp_path: Path
) -> None:
    """Over the WebDataset copy (the documented fit below trains MDS on 2 ranks)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    data = work / "wds"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BCL_STREAM_KEEP_SHM": "1"}
    step = {
        "data": str(data),
        "model_dir": str(work / "model"),
        "out": str(tmp_path),
        "scope": "node",
        "max_seq_len": 0,
        "processor": str(work / "processor"),
    }
    run = run_script(SCRIPT, json.dumps([step]), env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "normalization.txt").read_text() == "plan"
    batches = [json.loads((tmp_path / f"batches_rank{r}.json").read_text()) for r in range(2)]
    assert [len(b) for b in batches] == [2, 2]  # accumulation 2, one optimizer step
    ids = [i for rank in batches for b in rank for i in b["sample_ids"]]
    check_every_record_once(ids)
    assert len(ids) == 8
    records = records_by_id(data)
    # a micro-batch without images beside ones with: the vision tower must still join DDP's
    # reduction on that rank (else the ranks part), with a zero gradient
    images = [sum(len(stored_images(records[i], "r")) for i in b["sample_ids"])
              for rank in batches for b in rank]  # fmt: skip
    assert 0 in images and max(images) > 0
    config = Qwen2VLConfig.from_pretrained(work / "model")
    config._attn_implementation = "sdpa"
    model = Qwen2VLForConditionalGeneration(config)
    init, final = torch.load(tmp_path / "init.pt"), torch.load(tmp_path / "final.pt")
    model.load_state_dict(init)
    total, count = alone(model, [records[i] for i in ids], single_collate(work, data))
    assert count == sum(b["loss_tokens"] for rank in batches for b in rank)
    (total / count).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert any("visual" in n and g.abs().sum() > 0 for n, g in grads.items())  # images trained
    for name, grad in grads.items():
        torch.testing.assert_close(final[name] - init[name], -grad, rtol=1e-4, atol=1e-6)


def documented_commands() -> list[list[str]]:
    """The bash block of docs/vlm.md's "Train it" section, one argv per line (``python``: this
    interpreter)."""
    from doc_blocks import fenced_blocks

    text = (ROOT / "docs" / "vlm.md").read_text(encoding="utf-8")
    section = text.split("\n## Train it\n", 1)[1].split("\n## ", 1)[0]
    (_, block), *_ = fenced_blocks(section, {"bash"})
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert all(c[0] == "python" for c in commands), commands
    return [[sys.executable, *c[1:]] for c in commands]


def test_the_documented_command_trains_on_two_ranks_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' commands as written, their relative paths moved under ``tmp_path`` by
    ``BCL_STREAM_ROOT`` (the checkout's results/ stay untouched): the data script run as its
    ``__main__`` in this process (no new interpreter for it), the fit in a new process (its DDP
    launcher starts the second rank); then the fit again from its last mid-epoch checkpoint, in
    a new process. Both fits are ``python -m lightning_module`` processes forked from the tests'
    pre-imported server (tests/cli_process.py: ``-m``'s ``__main__`` and ``sys.argv``, so the
    launcher re-runs the same command line for rank 1, a fresh interpreter)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BCL_STREAM_ROOT": str(tmp_path),
           "BCL_STREAM_KEEP_SHM": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "BCL_STREAM_DEBUG"):
        env.pop(key, None)

    def run(argv: list[str]) -> None:
        assert argv[:3] == [sys.executable, "-m", "lightning_module"], argv
        done = run_module("lightning_module", *argv[3:], env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    (script, *script_args), *fits = [argv[1:] for argv in documented_commands()]
    assert script == "tools/vlm_data.py" and [f[:2] for f in fits] == [["-m", "lightning_module"]]
    monkeypatch.setenv("BCL_STREAM_ROOT", str(tmp_path))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [script, *script_args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    assert exited.value.code == 0
    fit = [sys.executable, *fits[0]]
    run(fit)
    work = tmp_path / "results" / "vlm" / "work"
    full = [read_pack_log(work / "logs" / f"packs_rank{r}.jsonl") for r in range(2)]
    steps = len(full[0])
    assert steps == len(full[1]) == 64 // (2 * 4)  # every record once, B = 4 on 2 ranks
    check_every_record_once([line["sample_ids"] for log in full for line in log])
    saved = [int(p.stem.split("step=")[1]) for p in (work / "ckpt").glob("epoch=0-step=*.ckpt")]
    stop = max(n for n in saved if n < steps)  # the latest mid-epoch one: the fewest steps left
    resumed = tmp_path / "resumed"
    run([*fit, "--ckpt_path", str(work / "ckpt" / f"epoch=0-step={stop}.ckpt"),
         "--trainer.default_root_dir", str(resumed),
         "--trainer.callbacks.0.init_args.directory", str(resumed / "logs"),
         "--trainer.callbacks.1.init_args.dirpath", str(resumed / "ckpt")])  # fmt: skip
    for rank in range(2):
        log = read_pack_log(resumed / "logs" / f"packs_rank{rank}.jsonl")
        key = [(x["step"], x["epoch"], x["sample_ids"]) for x in full[rank]]
        check_resumed_log(key, stop, [(x["step"], x["epoch"], x["sample_ids"]) for x in log])
    ends = [torch.load(d / "ckpt" / "last.ckpt", weights_only=False) for d in (work, resumed)]
    assert [end["global_step"] for end in ends] == [steps, steps]  # the final weights, both
    want, got = (end["state_dict"] for end in ends)
    assert want.keys() == got.keys()
    assert any("visual" in name for name in want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_image_text_data_needs_its_processor_and_text_data_refuses_one(
    work: Path, mds_dir: Path
) -> None:
    """Refused at set-up in one line each, before a worker decodes anything."""
    from bcl_stream.errors import DatasetError

    plan = {"pack_size": 2, "window": 2}
    cases = [
        (work / "mds", {}, "set batch.processor to that processor directory"),
        (mds_dir, {"processor": str(work / "processor")}, "holds no image-text records"),
        (work / "mds", {"processor": str(work / "model")}, "no preprocessor_config.json"),
        (work / "mds", {"processor": str(work / "processor"), "max_seq_len": 64},
         "a record with images is never cut"),
    ]  # fmt: skip
    for data, batch, message in cases:
        dm = BCLDataModule(str(data), plan=plan, batch={"collate": "packed", **batch})
        with pytest.raises(DatasetError, match=message):
            dm.setup_for(rank=0, world_size=1, ranks_per_node=1)


def test_a_plain_loop_gets_the_same_image_collate(work: Path) -> None:
    """``open_training`` (the plain PyTorch path, docs/pytorch.md) resolves the collate as the
    DataModule does: its loader's batches carry the images, processed in its worker."""
    from bcl_stream import BatchOptions, PlanKnobs, ProcessLayout, TrainingContext, TrainingKnobs
    from bcl_stream.training import open_training

    knobs = TrainingKnobs(
        plan=PlanKnobs(pack_size=4, window=2),
        batch=BatchOptions(collate="packed", labels="unshifted", processor=str(work / "processor")),
    )
    context = TrainingContext(process=ProcessLayout(rank=0, world_size=1, ranks_per_node=1))
    training = open_training(str(work / "wds"), knobs, context)
    assert isinstance(training.collate(), ImageCollate)
    batches = list(training.loader(num_workers=1))
    assert len(batches) == 8
    images = sum(int(b["image_counts"].sum()) for b in batches)
    assert images == 24  # every stored image once (32 records, one in 4 text only)
    assert all(("pixel_values" in b) == bool(b["image_counts"].sum()) for b in batches)
    assert all(b["position_ids"].shape == (3, 1, b["input_ids"].shape[1]) for b in batches)


def image_free_batch() -> dict[str, Any]:
    """One packed row of 6 text tokens (5 trained), no images: the vision tower unused."""
    return {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9, 10]]),
        "labels": torch.tensor([[-100, 6, 7, 8, 9, 10]]),
        "cu_seqlens": torch.tensor([0, 6]),
        "position_ids": torch.arange(6).expand(3, 1, 6),
    }


def test_an_image_free_batch_gives_the_vision_tower_a_zero_gradient(work: Path) -> None:
    """What keeps DDP's reduction the same on every rank (the 2-rank test above crashes
    without it): the vision parameters are in the graph of a batch without images, with a
    gradient of exactly 0, and the loss is unchanged."""
    module = HFCausalLM(str(work / "model"), attention="sdpa")
    batch = image_free_batch()
    total, count = module.loss_sum(batch)
    total.backward()
    with torch.no_grad():
        assert float(module.loss_sum(batch)[0]) == float(total)
    visual = {n: p.grad for n, p in module.model.named_parameters() if ".visual." in n}
    assert visual and all(g is not None and not g.any() for g in visual.values())
    assert int(count) == 5


def test_the_zero_term_stays_zero_where_the_vision_weights_sum_past_float16(work: Path) -> None:
    """In float16 a sum of a real vision tower's parameters is inf (Qwen2-VL-7B's LayerNorm
    weights alone sum to about 82,000, float16 stops at 65,504) and 0 x inf is NaN: the tiny
    tower's 71,008 weights set to 1 sum past it the same way. The image-free batch's training
    loss must stay its loss (failed with a NaN loss when the term was 0 x the sum)."""
    module = HFCausalLM(str(work / "model"), attention="sdpa", dtype="float16")
    visual = [p for n, p in module.model.named_parameters() if ".visual." in n]
    with torch.no_grad():
        for p in visual:
            p.fill_(1.0)
    assert sum(p.numel() for p in visual) > torch.finfo(torch.float16).max
    batch = image_free_batch()
    total, _ = module.loss_sum(batch)
    with torch.no_grad():
        want, _ = module.loss_sum(batch)
    assert torch.isfinite(want)
    assert float(total) == float(want)
    total.backward()
    assert all(p.grad is not None and not p.grad.any() for p in visual)


def test_the_processor_is_matched_by_content_not_path(work: Path, tmp_path: Path) -> None:
    """The index stores the processor's content fingerprint: a copy elsewhere (a JSON file
    re-indented) is the same processor; one whose chat template or image processor differs
    is refused at set-up in one line naming both, before a worker decodes anything."""
    from bcl_stream.errors import DatasetError
    from bcl_stream.vision.fingerprint import FINGERPRINT_KEY, processor_fingerprint

    stored = read_index(work / "mds").extra["vision"][FINGERPRINT_KEY]
    assert stored == processor_fingerprint(work / "processor")
    plan = {"pack_size": 2, "window": 2}

    def setup(processor: Path, data: Path = work / "mds") -> None:
        dm = BCLDataModule(
            str(data), plan=plan, batch={"collate": "packed", "processor": str(processor)}
        )
        dm.setup_for(rank=0, world_size=1, ranks_per_node=1)

    copy = tmp_path / "copy"
    shutil.copytree(work / "processor", copy)
    config = json.loads((copy / "preprocessor_config.json").read_text())
    (copy / "preprocessor_config.json").write_text(json.dumps(config, indent=7, sort_keys=True))
    setup(copy)  # another path, the same content

    template = tmp_path / "template"
    shutil.copytree(work / "processor", template)
    jinja = template / "chat_template.jinja"
    jinja.write_text(jinja.read_text().replace("<|im_start|>", "<|im_start|> "))
    pixels = tmp_path / "pixels"
    shutil.copytree(work / "processor", pixels)
    (pixels / "preprocessor_config.json").write_text(
        json.dumps({**config, "max_pixels": config["max_pixels"] * 2})
    )
    for other in (template, pixels):
        mine = processor_fingerprint(other)[:16]
        with pytest.raises(DatasetError, match=rf"{re.escape(str(other))}.*{mine}\) is not the processor the data "
                           rf"was preprocessed with \(processor, processor_sha256 {stored[:16]}"):  # fmt: skip
            setup(other)


def test_an_index_without_a_processor_fingerprint_is_read_with_a_warning(
    work: Path, tmp_path: Path
) -> None:
    """An image-text index written before processors were fingerprinted: read, with one
    warning naming the index and what to do (the collate's image-token check still runs)."""
    from bcl_stream.io.index_meta import INDEX_JSON, seal
    from bcl_stream.vision.fingerprint import FINGERPRINT_KEY

    old = tmp_path / "old"
    shutil.copytree(work / "mds", old)
    doc = json.loads((old / INDEX_JSON).read_text())
    del doc["extra"]["vision"][FINGERPRINT_KEY]
    (old / INDEX_JSON).write_text(json.dumps(seal(doc)))
    dm = BCLDataModule(
        str(old), plan={"pack_size": 2, "window": 2},
        batch={"collate": "packed", "processor": str(work / "processor")},
    )  # fmt: skip
    with pytest.warns(
        UserWarning, match=rf"{INDEX_JSON}: its extra.vision has no {FINGERPRINT_KEY}.*re-run"
    ):
        dm.setup_for(rank=0, world_size=1, ranks_per_node=1)
