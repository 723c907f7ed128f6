"""Labels in both conventions train the same (position, target) pairs, and docs/lightning.md's
batch table says exactly what the collate returns (key, layout, dtype) and the DataModule's
defaults as its signature has them (issue points 4 and 11)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bcl_stream.loading.collate import IGNORE_INDEX, PackCollate, collate_packed, collate_padded
from lightning_module.datamodule import BCLDataModule

DOC = Path(__file__).resolve().parents[2] / "docs" / "lightning.md"
LENGTHS = [[5], [3, 7, 1], [4, 1, 6, 2], [2, 2]]


def make_pack(lengths: list[int]) -> list[dict]:  # type: ignore[type-arg]
    rng = np.random.default_rng(sum(lengths))
    return [
        {"input_ids": rng.integers(0, 1000, size=n).astype(np.uint32), "sample_id": 7 + i}
        for i, n in enumerate(lengths)
    ]


def pairs(inputs: torch.Tensor, targets: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, position, target) for every position with a target."""
    rows, cols = torch.nonzero(targets != IGNORE_INDEX, as_tuple=True)
    return [(int(r), int(c), int(targets[r, c])) for r, c in zip(rows, cols, strict=True)]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("collate", [collate_padded, collate_packed])
def test_hf_shift_of_unshifted_labels_equals_shifted_labels(collate, lengths) -> None:  # type: ignore[no-untyped-def]
    pack = make_pack(lengths)
    shifted = collate(pack)
    unshifted = collate(pack, labels="unshifted")
    assert torch.equal(shifted["input_ids"], unshifted["input_ids"])
    # What a Hugging Face causal LM does inside its loss: logits[..., :-1] vs labels[..., 1:].
    hf_targets = unshifted["labels"][:, 1:]
    assert pairs(shifted["input_ids"], shifted["labels"][:, :-1]) == pairs(
        unshifted["input_ids"], hf_targets
    )
    assert (shifted["labels"][:, -1] == IGNORE_INDEX).all()
    # Every target is the next token of the same record: never across a boundary.
    assert len(pairs(shifted["input_ids"], shifted["labels"])) == sum(n - 1 for n in lengths)


def test_unknown_labels_convention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="labels must be one of"):
        collate_padded(make_pack([3]), labels="hf")
    with pytest.raises(ValueError, match="labels must be one of"):
        BCLDataModule(str(tmp_path), batch={"labels": "hf"})


def table(section: str) -> list[list[str]]:
    text = DOC.read_text().split(section, 1)[1]
    rows = []
    for line in text.splitlines():
        if line.startswith("## "):
            break
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_docs_batch_table_matches_the_collate(layout: str) -> None:
    rows = table("## The batch")
    assert rows[0] == ["key", "layout", "shape", "dtype", "meaning"]
    documented = {
        key.strip().strip("`"): row[3]
        for row in rows[1:]
        if row[1] in (layout, "both")
        for key in row[0].split(",")
    }
    batch = PackCollate(layout, (np.ones(100),))(make_pack([3, 5, 2]))
    actual = {
        key: "int" if isinstance(value, int) else str(value.dtype).removeprefix("torch.")
        for key, value in batch.items()
    }
    assert documented == actual


def test_docs_state_the_datamodule_defaults() -> None:
    rows = table("Defaults (what you get")
    cells = [cell for row in rows[1:] for cell in row if cell]
    documented = {cells[i].strip("`"): cells[i + 1] for i in range(0, len(cells) - 1, 2)}
    params = inspect.signature(BCLDataModule.__init__).parameters
    for name, param in params.items():
        if name in ("self", "data") or param.kind is param.VAR_KEYWORD:
            continue
        assert name in documented, f"docs/lightning.md does not state the default of {name}"
        shown = re.sub(r"\s*\(.*\)$", "", documented[name]).strip("`")
        assert shown == json.dumps(param.default) or shown == repr(param.default), name
