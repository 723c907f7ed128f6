"""The image-text batch: images decoded and processed in DataLoader workers, the model's keys
(``pixel_values``, ``image_grid_thw``) exactly what the Hugging Face processor gives for the
same records, both layouts; packed rows restart Qwen2-VL's 3-D positions at every record; a
processor other than the data's, and a damaged image, are refused naming the record."""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.collate import PackCollate
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.vision.batch import ImageCollate
from bcl_stream.vision.storage import stored_images
from tests.vlm_processors import image_text_inputs, qwen2_vl_processor_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    proc = qwen2_vl_processor_dir(root / "proc")
    files, _ = image_text_inputs(root / "in")
    out = {"proc": proc}
    for fmt in ("mds", "wds"):
        preprocess(files, str(root / fmt), format=fmt, processor=str(proc), progress=False)
        out[fmt] = root / fmt
    return out


def _loader(fmt: str, root: Path, proc: Path, layout: str, workers: int, b: int = 3) -> PackLoader:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=b, window=2, layout=layout)
    base = PackCollate.for_dataset(read_index(root), None, layout, labels="unshifted")
    return PackLoader(
        reader(root, config, 0), num_workers=workers, collate_fn=ImageCollate(base, str(proc))
    )


def _oracle(processor: object, pack_records: list[dict]) -> dict:
    texts, images = [], []
    for record in pack_records:
        text = processor.tokenizer.decode(np.asarray(record["input_ids"]).tolist())
        texts.append(re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", text))
        images += [Image.open(io.BytesIO(b)).convert("RGB") for b, _, _ in
                   stored_images(record, "r")]  # fmt: skip
    return processor(text=texts, images=images or None, return_tensors="pt", padding=True)


@pytest.mark.parametrize("fmt", ["mds", "wds"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_batches_carry_the_processor_keys_exactly(data: dict, fmt: str, layout: str) -> None:
    processor = transformers.AutoProcessor.from_pretrained(str(data["proc"]))
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=3, window=2, layout=layout)
    raw = list(PackLoader(reader(data[fmt], config, 0)))  # the records of each pack
    batches = list(_loader(fmt, data[fmt], data["proc"], layout, workers=2))
    assert len(batches) == len(raw) == 2
    seen = []
    for pack, batch in zip(raw, batches, strict=True):
        want = _oracle(processor, pack)
        assert torch.equal(batch["image_grid_thw"], want["image_grid_thw"])
        assert torch.equal(batch["pixel_values"], want["pixel_values"])
        ids = [np.asarray(r["input_ids"]).tolist() for r in pack]
        for row, record_ids in enumerate(ids):  # the processor's ids are the stored ones
            got = want["input_ids"][row][want["attention_mask"][row].bool()].tolist()
            assert got == record_ids
        assert batch["image_counts"].tolist() == [len(stored_images(r, "r")) for r in pack]
        seen += batch["sample_ids"].tolist()
    assert sorted(seen) == list(range(6))


def test_packed_positions_restart_at_every_record(data: dict) -> None:
    """The 3-D rotary positions of a packed row equal each record's alone (the model's own
    ``get_rope_index`` on a batch of one)."""
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    processor = transformers.AutoProcessor.from_pretrained(str(data["proc"]))
    tok = processor.tokenizer
    config = Qwen2VLConfig(
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
    )
    owner = type("Owner", (), {"config": config})()
    for batch in _loader("mds", data["mds"], data["proc"], "packed", workers=0):
        cu = batch["cu_seqlens"].tolist()
        grids = batch["image_grid_thw"]
        at = 0
        assert batch["position_ids"].shape == (3, 1, cu[-1])
        for r, (a, b) in enumerate(itertools.pairwise(cu)):
            n = int(batch["image_counts"][r])
            alone, _ = Qwen2VLModel.get_rope_index(
                owner, batch["input_ids"][:, a:b], grids[at : at + n] if n else None, None, None
            )
            at += n
            assert torch.equal(batch["position_ids"][:, :, a:b], alone)
            assert int(batch["position_ids"][0, 0, a]) == 0


def test_another_processor_is_refused_naming_the_record(data: dict, tmp_path: Path) -> None:
    other = qwen2_vl_processor_dir(tmp_path / "other", min_pixels=16 * 28 * 28)
    loader = _loader("mds", data["mds"], other, "packed", workers=0)
    with pytest.raises(DatasetError, match=r"record \d+: its stored ids hold \d+ image tokens"):
        next(iter(loader))


def test_a_damaged_image_is_refused_naming_the_record(data: dict) -> None:
    from bcl_stream.vision.batch import decode

    good = stored_images(
        next(
            iter(
                PackLoader(
                    MDSPackDataset(
                        data["mds"], ReaderConfig.build(world_size=1, pack_size=1, window=2), 0
                    )
                )
            )
        )[0],
        "r",
    )
    if not good:
        pytest.skip("first record has no image")
    data_bytes = good[0][0]
    with pytest.raises(DatasetError, match="record 7 image 0: the stored image cannot be decoded"):
        decode(data_bytes[: len(data_bytes) // 2], "record 7 image 0")
