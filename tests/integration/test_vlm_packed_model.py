"""A packed image-text batch runs in a real (tiny, random-initialised) Qwen2-VL exactly as its
records run alone: the block-diagonal mask of ``cu_seqlens`` (what ``HFCausalLM`` builds on CPU)
and ``ImageCollate``'s per-record 3-D positions keep every record to itself (logits and summed
loss equal to float tolerance). Without the mask, the row attends across records and the
logits differ: the check can fail. (The rotary positions alone would not show it: a record's
positions shifted by a constant give the same attention, RoPE being relative; per-record
positions keep the values as small as the record's own.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.collate import IGNORE_INDEX, PackCollate
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.vision.batch import ImageCollate
from lightning_module.hf_causal_lm import packed_mask
from tests.hf_models import tiny_qwen2_vl_dir
from tests.vlm_processors import image_text_inputs, qwen2_vl_processor_dir

transformers = pytest.importorskip("transformers")


def tiny_qwen2_vl(processor: object, directory: Path) -> torch.nn.Module:
    """The shared tiny Qwen2-VL (2 layers, one vision block) built from its config: no
    download."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    config = Qwen2VLConfig.from_pretrained(tiny_qwen2_vl_dir(directory, processor))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vlm_fit")
    proc = qwen2_vl_processor_dir(root / "proc")
    files, _ = image_text_inputs(root / "in")
    preprocess(files, str(root / "mds"), format="mds", processor=str(proc), progress=False)
    return proc, root / "mds"


def _forward(model: torch.nn.Module, batch: dict, masked: bool = True) -> torch.Tensor:
    kwargs = {}
    if "cu_seqlens" in batch and masked:
        kwargs["attention_mask"] = packed_mask(
            batch["cu_seqlens"], additive=False, dtype=torch.float32
        )
        kwargs["position_ids"] = batch["position_ids"]
    return model(
        input_ids=batch["input_ids"],
        pixel_values=batch.get("pixel_values"),
        image_grid_thw=batch.get("image_grid_thw"),
        **kwargs,
    ).logits[0]


def _loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy, Hugging Face's (unshifted) convention: logits[t] predicts
    labels[t + 1]."""
    return F.cross_entropy(
        logits[:-1].float(), labels[1:], ignore_index=IGNORE_INDEX, reduction="sum"
    )


def test_packed_equals_each_record_alone(setup: tuple[Path, Path], tmp_path: Path) -> None:
    proc_dir, data = setup
    processor = transformers.AutoProcessor.from_pretrained(str(proc_dir))
    model = tiny_qwen2_vl(processor, tmp_path / "model")
    config = ReaderConfig.build(world_size=1, pack_size=3, window=2, layout="packed")
    base = PackCollate.for_dataset(read_index(data), None, "packed", labels="unshifted")
    collate = ImageCollate(base, str(proc_dir))
    alone_collate = ImageCollate(
        PackCollate.for_dataset(read_index(data), None, "padded", labels="unshifted"),
        str(proc_dir),
    )
    packs = list(PackLoader(MDSPackDataset(data, config, 0)))
    assert len(packs) == 2
    differs = []
    with torch.no_grad():
        for pack in packs:
            batch = collate(pack)
            logits = _forward(model, batch)
            plain = _forward(model, batch, masked=False)  # one causal sequence
            cu = batch["cu_seqlens"].tolist()
            packed_loss = alone_loss = torch.zeros((), dtype=torch.float64)
            for r, record in enumerate(pack):
                one = alone_collate([record])
                alone = _forward(model, one)
                torch.testing.assert_close(logits[cu[r] : cu[r + 1]], alone, atol=1e-5, rtol=0)
                differs.append(float((plain[cu[r] : cu[r + 1]] - alone).abs().max()))
                labels = batch["labels"][0, cu[r] : cu[r + 1]]
                packed_loss += _loss_sum(logits[cu[r] : cu[r + 1]], labels).double()
                alone_loss += _loss_sum(alone, one["labels"][0]).double()
            torch.testing.assert_close(packed_loss, alone_loss, atol=1e-4, rtol=0)
    # without the mask, records after the first attend to those before them
    assert max(differs) > 1e-3
