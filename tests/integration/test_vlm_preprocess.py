"""``preprocess --processor``: image-text records in their layouts, written to MDS and
WebDataset with their images, ids exact against the Hugging Face processor, components in the
index, ``inspect --json`` reporting them, and every bad image named (or skipped and counted).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.vision.components import read_components
from bcl_stream.vision.storage import stored_images
from tests.vlm_processors import image_bytes, image_text_inputs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def proc_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.vlm_processors import qwen2_vl_processor_dir

    return str(qwen2_vl_processor_dir(tmp_path_factory.mktemp("qwen2vl")))


def _read_back(fmt: str, root: Path) -> list[dict]:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=2)
    samples = {s["sample_id"]: s for pack in PackLoader(reader(root, config, 0)) for s in pack}
    return [samples[i] for i in range(len(samples))]


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_every_layout_is_stored_exactly(tmp_path: Path, proc_dir: str, fmt: str) -> None:
    files, images = image_text_inputs(tmp_path / "in")
    out = tmp_path / "out"
    report = preprocess(files, str(out), format=fmt, processor=proc_dir, progress=False)
    assert report.records_written == 6
    processor = transformers.AutoProcessor.from_pretrained(proc_dir)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    index = read_index(out)
    comps = read_components(out, index.tokens)
    assert comps is not None
    assert index.extra["vision"]["geometry"]["family"] == "qwen2_vl"
    for i, sample in enumerate(_read_back(fmt, out)):
        got = stored_images(sample, f"record {i}")
        assert [g[0] for g in got] == images[i]  # the files' bytes, unchanged
        ids = np.asarray(sample["input_ids"])
        # the oracle: the processor on the decoded images and the template's rendering
        pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images[i]]
        assert [(g[1], g[2]) for g in got] == [p.size for p in pil]
        text = processor.tokenizer.decode(ids.tolist())
        rendered = _collapse(text)
        want = processor(text=[rendered], images=pil or None, return_tensors="pt")
        assert ids.tolist() == want["input_ids"][0].tolist()
        grids = want["image_grid_thw"].tolist() if pil else []
        assert comps.patches_of(i).tolist() == [int(np.prod(g)) for g in grids]
        assert comps.image_tokens[i] == int((ids == pad).sum())
        assert comps.text_tokens[i] + comps.image_tokens[i] == index.tokens[i]
    # inspect --json reports the image terms
    assert main(["inspect", str(out), "--json"]) == 0


def _collapse(text: str) -> str:
    """The template's rendering from stored ids: each run of image-pad tokens back to one."""
    import re

    return re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", text)


def test_inspect_json_reports_image_tokens_and_patches(
    tmp_path: Path, proc_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files, _ = image_text_inputs(tmp_path / "in")
    out = tmp_path / "out"
    preprocess(files, str(out), format="wds", processor=proc_dir, progress=False)
    comps = read_components(out)
    assert comps is not None
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"], report["problems"]
    assert report["image_tokens"]["total"] == float(comps.image_tokens.sum()) > 0
    assert report["patches"]["total"] == float(comps.image_patches.sum())
    assert report["images"] == {"count": 6, "records_with_images": 5}
    assert main(["inspect", str(out)]) == 0
    assert "image tokens total" in capsys.readouterr().out


def _bomb_png(side: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))


BAD = {
    "image_missing": lambda d: "nope.jpg",
    "image_empty": lambda d: _file(d, "empty.png", b""),
    "image_unreadable": lambda d: _file(d, "text.png", b"plain text, not an image"),
    "image_too_large": lambda d: _file(d, "bomb.png", _bomb_png(12000)),
    "image_aspect": lambda d: _file(d, "thin.png", image_bytes(402, 2)),  # aspect 201
}


def _file(root: Path, name: str, data: bytes) -> str:
    (root / name).write_bytes(data)
    return name


@pytest.mark.parametrize("reason", sorted(BAD))
def test_each_bad_image_is_named_or_skipped_and_counted(
    tmp_path: Path, proc_dir: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    good = _file(root, "good.png", image_bytes(50, 50))
    bad = BAD[reason](root)
    rows = [
        {"image": good, "caption": "fine"},
        {"image": bad, "caption": "broken"},
        {"image": good, "caption": "fine again"},
    ]
    src = root / "d.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=rf"{src}:2: .*--skip-bad"):
        preprocess([str(src)], str(tmp_path / "o1"), processor=proc_dir, progress=False)
    report = preprocess(
        [str(src)], str(tmp_path / "o2"), processor=proc_dir, skip_bad=True, progress=False
    )
    assert report.records_written == 2 and report.skipped_bad == {reason: 1}
    # the command line: one line naming the record, exit 2
    capsys.readouterr()
    code = main(["preprocess", str(src), "--output", str(tmp_path / "o3"),
                 "--processor", proc_dir, "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{src}:2" in err[0], err


def test_img2dataset_webdataset_trains_the_caption_as_the_answer(
    tmp_path: Path, proc_dir: str
) -> None:
    """img2dataset's layout, a tar of ``NNN.jpg`` + ``NNN.txt`` + ``NNN.json``, as input: one
    record per key, the caption trained as the assistant's answer to the image."""
    import tarfile

    from bcl_stream.text.loss_spans import mask_from_spans

    shard = tmp_path / "00000.tar"
    captions = ["a red square", "two dogs on grass", "a tall tower"]
    sizes = [(64, 64), (320, 200), (30, 400)]
    with tarfile.open(shard, "w") as tar:
        for i, (caption, (w, h)) in enumerate(zip(captions, sizes, strict=True)):
            meta = {"caption": caption, "width": w, "height": h, "status": "success"}
            for ext, data in (
                ("jpg", image_bytes(w, h, "JPEG", seed=i)),
                ("txt", caption.encode()),
                ("json", json.dumps(meta).encode()),
            ):
                info = tarfile.TarInfo(f"{i:09d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    report = preprocess([str(shard)], str(out), format="wds", processor=proc_dir, progress=False)
    assert report.records_written == 3
    processor = transformers.AutoProcessor.from_pretrained(proc_dir)
    for i, sample in enumerate(_read_back("wds", out)):
        ids = np.asarray(sample["input_ids"])
        messages = [
            {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": captions[i]}]},
        ]
        text = processor.apply_chat_template(messages, tokenize=False)
        pil = Image.open(io.BytesIO(stored_images(sample, "r")[0][0])).convert("RGB")
        assert pil.size == sizes[i]
        want = processor(text=[text], images=[pil], return_tensors="pt")
        assert ids.tolist() == want["input_ids"][0].tolist()
        trained = processor.tokenizer.decode(ids[mask_from_spans(sample["loss_spans"], ids.size)])
        assert trained == f"{captions[i]}<|im_end|>\n"
        assert sample["json"]["source"] == f"{shard}:{i:09d}"


def test_annotate_refuses_an_image_text_dataset(tmp_path: Path, proc_dir: str) -> None:
    """A new index from annotate without --processor would drop the image cost components:
    refused, one line."""
    files, _ = image_text_inputs(tmp_path / "in")
    out = tmp_path / "out"
    preprocess(files, str(out), processor=proc_dir, progress=False)
    before = (out / "bcl_index.json").read_bytes()
    with pytest.raises(DatasetError, match=r"an image-text dataset .*pass --processor DIR"):
        annotate(str(out), overwrite=True)
    assert (out / "bcl_index.json").read_bytes() == before
