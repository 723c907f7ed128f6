"""Collate: exact layouts, auditing fields, truncation, and errors that name the record."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcl_stream.errors import DatasetError
from bcl_stream.loading.collate import IGNORE_INDEX, collate_packed, collate_padded


def make_pack(lengths: list[int], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"input_ids": rng.integers(0, 100277, size=n).astype(np.uint32), "sample_id": 10 + i}
        for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("lengths", [[5], [3, 7, 1], [4, 0, 6, 2], [1, 1, 1, 1]])
def test_padded_layout_holds_every_token_once(lengths: list[int]) -> None:
    pack = make_pack(lengths)
    batch = collate_padded(pack)
    assert batch["input_ids"].shape == (len(lengths), max(1, max(lengths)))
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert batch["tokens"].tolist() == lengths
    assert batch["sample_ids"].tolist() == [r["sample_id"] for r in pack]
    for row, record in enumerate(pack):
        n = len(record["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == record["input_ids"].tolist()
        expected = [*record["input_ids"][1:].tolist(), IGNORE_INDEX] if n else []
        assert batch["labels"][row, :n].tolist() == expected
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("lengths", [[5], [3, 7, 1], [4, 0, 6, 2]])
def test_packed_layout_boundaries_and_positions(lengths: list[int]) -> None:
    pack = make_pack(lengths, seed=1)
    batch = collate_packed(pack)
    total = sum(lengths)
    assert batch["input_ids"].shape == (1, total)
    assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert batch["cu_seqlens"].dtype == torch.int32
    cu = batch["cu_seqlens"].tolist()
    for i, record in enumerate(pack):
        s, e = cu[i], cu[i + 1]
        assert batch["input_ids"][0, s:e].tolist() == record["input_ids"].tolist()
        assert batch["position_ids"][0, s:e].tolist() == list(range(e - s))
        if e > s:  # never predict across a record boundary
            assert batch["labels"][0, e - 1].item() == IGNORE_INDEX
    labelled = (batch["labels"] != IGNORE_INDEX).sum().item()
    assert labelled == sum(max(n - 1, 0) for n in lengths)


@pytest.mark.parametrize("collate", [collate_padded, collate_packed])
def test_truncation_is_explicit_and_reported(collate) -> None:
    pack = make_pack([3, 9, 5])
    batch = collate(pack, max_seq_len=4)
    assert batch["tokens"].tolist() == [3, 4, 4]
    assert batch["truncated_tokens"].tolist() == [0, 5, 1]
    untouched = collate(pack)
    assert untouched["tokens"].tolist() == [3, 9, 5]
    assert untouched["truncated_tokens"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("collate", [collate_padded, collate_packed])
def test_bad_input_names_the_record(collate) -> None:
    with pytest.raises(ValueError, match="empty pack"):
        collate([])
    with pytest.raises(DatasetError, match="record 1 of the pack"):
        collate([make_pack([2])[0], {"input_ids": np.zeros(3, np.uint32)}])
    bad = {"input_ids": np.zeros((2, 2), np.uint32), "sample_id": 77}
    with pytest.raises(DatasetError, match="sample 77"):
        collate([bad])
    with pytest.raises(ValueError, match="max_seq_len"):
        collate(make_pack([2]), max_seq_len=0)
