"""Image-text records written in ``--part I/N`` runs and merged: the merged dataset equals one
run record for record (ids, sources, stored images, costs) and its cost components file is the
single run's; parts written under different processors are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import DatasetError
from bcl_stream.formats.mds_reader import MDSPackDataset
from bcl_stream.formats.wds_reader import WDSPackDataset
from bcl_stream.io.index import read_index
from bcl_stream.loading.loader import PackLoader
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.merge import merge
from bcl_stream.vision.components import read_components
from bcl_stream.vision.storage import stored_images
from tests.vlm_processors import image_text_inputs, qwen2_vl_processor_dir

pytest.importorskip("transformers")

PARTS = 3


def _records(fmt: str, root: Path) -> list[tuple[list[int], str, list[bytes]]]:
    """Every record as the readers yield it, in record-id order: ids, source, image bytes."""
    reader = MDSPackDataset if fmt == "mds" else WDSPackDataset
    config = ReaderConfig.build(world_size=1, pack_size=1, window=2)
    samples = {s["sample_id"]: s for pack in PackLoader(reader(root, config, 0)) for s in pack}
    assert sorted(samples) == list(range(len(samples)))
    out = []
    for i in range(len(samples)):
        s = samples[i]
        source = s["source"] if "source" in s else s["json"]["source"]
        images = [g[0] for g in stored_images(s, f"record {i}")]
        out.append((np.asarray(s["input_ids"]).tolist(), str(source), images))
    return out


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_merged_image_text_parts_equal_a_single_run(tmp_path: Path, fmt: str) -> None:
    proc = str(qwen2_vl_processor_dir(tmp_path / "proc"))
    files, _ = image_text_inputs(tmp_path / "in")
    single, parted = tmp_path / "single", tmp_path / "parted"
    preprocess(files, str(single), format=fmt, processor=proc, progress=False, workers=1)
    for i in range(PARTS):
        preprocess(
            files, str(parted), format=fmt, processor=proc, progress=False, workers=1,
            part=f"{i}/{PARTS}",
        )  # fmt: skip
    # the parts really split the images: no single part holds them all
    per_part = [read_components(parted / f"part-{i}-of-{PARTS}") for i in range(PARTS)]
    assert all(c is not None and c.n_images < 6 for c in per_part)
    merged = merge(parted)
    want = read_index(single)
    assert merged.tokens.tolist() == want.tokens.tolist()
    assert merged.costs().tolist() == want.costs().tolist()
    assert merged.extra["vision"] == want.extra["vision"]
    got_c, want_c = read_components(parted, merged.tokens), read_components(single, want.tokens)
    assert got_c is not None and want_c is not None
    for name in ("text_tokens", "image_tokens", "image_offsets", "image_patches"):
        assert getattr(got_c, name).tolist() == getattr(want_c, name).tolist(), name
    assert (parted / "bcl_components.npz").read_bytes() == (
        single / "bcl_components.npz"
    ).read_bytes()
    assert _records(fmt, parted) == _records(fmt, single)


def test_parts_of_different_processors_are_refused(tmp_path: Path) -> None:
    """Part 1 written after the processor's max_pixels changed: its image tokens are counted
    under another geometry, so the merge names it instead of mixing the two."""
    import json

    files, _ = image_text_inputs(tmp_path / "in")
    proc = qwen2_vl_processor_dir(tmp_path / "proc")
    out = tmp_path / "out"
    preprocess(files, str(out), processor=str(proc), progress=False, part="0/2")
    config = proc / "preprocessor_config.json"
    data = json.loads(config.read_text())
    data["max_pixels"] = data["size"]["longest_edge"] = 16 * 28 * 28
    config.write_text(json.dumps(data))
    preprocess(files, str(out), processor=str(proc), progress=False, part="1/2")
    with pytest.raises(DatasetError, match=r"part-1-of-2: its vision is .*Re-run `--part 1/2`"):
        merge(out)
