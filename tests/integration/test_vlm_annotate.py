"""``annotate DIR --processor DIR``: existing image-text datasets counted in place, an
img2dataset WebDataset (``NNN.jpg`` + ``NNN.txt`` + ``NNN.json``) and MDS image columns written
by stock ``MDSWriter``. The cost index and components equal what ``preprocess --processor``
writes for the same records, the shards are untouched (stock webdataset reads them as before),
our readers yield the ids ``preprocess`` stored and the collate finds the images; a bad image
is one line naming the record."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bcl_stream.cli import main
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.collate import PackCollate
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.annotate import annotate
from bcl_stream.preprocess.merge import merge
from bcl_stream.records.image_text import record_images
from bcl_stream.records.source import RecordSource
from bcl_stream.vision.batch import ImageCollate
from bcl_stream.vision.components import FIELDS, read_components
from tests.vlm_processors import image_bytes, qwen2_vl_processor_dir

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CAPTIONS = ["a red square", "two dogs on grass", "a tall tower", "a wide field", "sky"]
SIZES = [(64, 64), (320, 200), (30, 400), (500, 90), (120, 120)]


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(qwen2_vl_processor_dir(tmp_path_factory.mktemp("qwen2vl")))


def _img2dataset(root: Path, bad: int | None = None) -> Path:
    """Two img2dataset shards (records 0-2 and 3-4); record ``bad``'s jpg is damaged."""
    root.mkdir(parents=True)
    for shard, keys in (("00000.tar", range(3)), ("00001.tar", range(3, 5))):
        with tarfile.open(root / shard, "w") as tar:
            for i in keys:
                w, h = SIZES[i]
                meta = {"caption": CAPTIONS[i], "width": w, "height": h, "status": "success"}
                jpg = b"\xff\xd8\xff\xe0 damaged" if i == bad else image_bytes(w, h, "JPEG", i)
                for ext, data in (
                    ("jpg", jpg),
                    ("txt", CAPTIONS[i].encode()),
                    ("json", json.dumps(meta).encode()),
                ):
                    info = tarfile.TarInfo(f"{i:09d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root


def _same_costs(got: Path, want: Path) -> None:
    a, b = read_index(got), read_index(want)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.costs().tolist() == b.costs().tolist()
    assert a.trained.tolist() == b.trained.tolist()
    assert a.extra["vision"] == b.extra["vision"]
    ca, cb = read_components(got, a.tokens), read_components(want, b.tokens)
    assert ca is not None and cb is not None
    for name in FIELDS:
        assert getattr(ca, name).tolist() == getattr(cb, name).tolist(), name


def _read(fmt: str, root: Path) -> list[dict]:
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=2)
    samples = {s["sample_id"]: s for pack in PackLoader(reader(root, config, 0)) for s in pack}
    return [samples[i] for i in range(len(samples))]


def _digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.glob("*.tar")}


def test_img2dataset_webdataset_annotated_in_place_equals_preprocess(
    tmp_path: Path, proc: str
) -> None:
    import webdataset as wds

    data = _img2dataset(tmp_path / "wds")
    before = _digests(data)
    stock_before = [
        dict(s) for s in wds.WebDataset(str(data / "0000{0..1}.tar"), shardshuffle=False)
    ]
    written = tmp_path / "pre"
    preprocess(sorted(str(p) for p in data.glob("*.tar")), str(written), format="wds",
               processor=proc, progress=False)  # fmt: skip
    assert main(["annotate", str(data), "--processor", proc, "--no-progress"]) == 0
    _same_costs(data, written)
    assert _digests(data) == before  # the shards are not rewritten
    stock = [dict(s) for s in wds.WebDataset(str(data / "0000{0..1}.tar"), shardshuffle=False)]
    assert stock == stock_before
    # our reader encodes each record in place exactly as preprocess stored it
    got, want = _read("wds", data), _read("wds", written)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.asarray(g["input_ids"]).tolist() == np.asarray(w["input_ids"]).tolist()
        assert np.asarray(g["loss_spans"]).tolist() == np.asarray(w["loss_spans"]).tolist()
        assert record_images(g, f"record {i}") == record_images(w, f"record {i}")
    # the batch the model gets: the collate decodes the record's own jpg member
    base = PackCollate.for_dataset(read_index(data), None, "packed", labels="unshifted")
    got_batch = ImageCollate(base, proc)(got[:2])
    want_batch = ImageCollate(base, proc)(want[:2])
    for key in ("input_ids", "pixel_values", "image_grid_thw", "image_counts"):
        assert torch.equal(got_batch[key], want_batch[key]), key


def test_annotate_parts_of_an_img2dataset_merge_to_the_whole(tmp_path: Path, proc: str) -> None:
    whole, parted = _img2dataset(tmp_path / "whole"), _img2dataset(tmp_path / "parted")
    annotate(str(whole), source=RecordSource(processor=proc), progress=False)
    for i in range(2):
        annotate(str(parted), source=RecordSource(processor=proc), progress=False, part=f"{i}/2")
    merge(parted)
    _same_costs(parted, whole)


def test_mds_image_columns_annotated_in_place_equal_preprocess(tmp_path: Path, proc: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    images = [image_bytes(w, h, "PNG", i) for i, (w, h) in enumerate(SIZES)]
    data = tmp_path / "mds"
    with MDSWriter(out=str(data), columns={"image": "bytes", "caption": "str"}) as out:
        for img, caption in zip(images, CAPTIONS, strict=True):
            out.write({"image": img, "caption": caption})
    source = tmp_path / "captions.parquet"
    pq.write_table(
        pa.table({"image": [{"bytes": b, "path": None} for b in images], "caption": CAPTIONS}),
        source,
    )
    written = tmp_path / "pre"
    preprocess([str(source)], str(written), processor=proc, progress=False)
    annotate(str(data), source=RecordSource(processor=proc), progress=False)
    _same_costs(data, written)
    got, want = _read("mds", data), _read("mds", written)
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g["input_ids"]).tolist() == np.asarray(w["input_ids"]).tolist()
        assert [x[1:] for x in record_images(g, "")] == [x[1:] for x in record_images(w, "")]


def test_a_bad_image_is_one_line_naming_the_record(
    tmp_path: Path, proc: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _img2dataset(tmp_path / "wds", bad=1)
    assert main(["annotate", str(data), "--processor", proc, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "00000.tar:000000001" in err[0] and "image_unreadable" in err[0]
    assert "replace or remove it" in err[0]
    assert not (data / "bcl_index.json").exists()


def test_without_processor_an_image_dataset_is_refused_naming_the_option(
    tmp_path: Path, proc: str
) -> None:
    data = _img2dataset(tmp_path / "wds")
    with pytest.raises(DatasetError, match=r"image column 'jpg'.*--processor DIR"):
        annotate(str(data), progress=False)
    annotate(str(data), source=RecordSource(processor=proc), progress=False)
    with pytest.raises(DatasetError, match=r"image-text dataset .*--processor DIR"):
        annotate(str(data), overwrite=True, progress=False)  # would drop the components


def test_mds_jpeg_columns_are_read_without_decoding_and_pil_columns_refused(
    tmp_path: Path, proc: str
) -> None:
    """Streaming opens ``jpeg`` columns lazily: the file's bytes are counted (sizes from the
    header); a ``pil`` column holds decoded pixels, no file: refused naming the record."""
    from PIL import Image
    from streaming import MDSWriter

    for enc in ("jpeg", "pil"):
        with MDSWriter(out=str(tmp_path / enc), columns={"jpg": enc, "txt": "str"}) as out:
            for i, (w, h) in enumerate(SIZES[:2]):
                pixels = Image.open(io.BytesIO(image_bytes(w, h, "JPEG", i))).convert("RGB")
                out.write({"jpg": pixels, "txt": CAPTIONS[i]})
    annotate(str(tmp_path / "jpeg"), source=RecordSource(processor=proc), progress=False)
    comps = read_components(tmp_path / "jpeg")
    assert comps is not None and comps.n_images == 2
    got = _read("mds", tmp_path / "jpeg")
    assert [[x[1:] for x in record_images(s, "")] for s in got] == [[s] for s in SIZES[:2]]
    with pytest.raises(DatasetError, match=r"sample 0: image 0: .*decoded pixels .*'pil' column"):
        annotate(str(tmp_path / "pil"), source=RecordSource(processor=proc), progress=False)
