"""Loss masks in batches: -100 outside a record's ``loss_spans`` in both label conventions,
trained-token counts per record and per batch, Hugging Face's padding-free keys exactly as
``transformers.DataCollatorWithFlattening`` makes them, and malformed masks refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sft_records import BAD_SPANS, span_pack
from transformers import DataCollatorWithFlattening

from bcl_stream.epoch.loss_tokens import STEP_LOSS_TOKENS
from bcl_stream.errors import DatasetError
from bcl_stream.loading.collate import IGNORE_INDEX, PackCollate, collate_packed, collate_padded

# (length, spans) per record: several spans, none, a span touching position 0, the whole record
RECORDS = [
    (9, [2, 4, 6, 9]),
    (5, None),
    (6, [0, 3]),
    (4, [0, 4]),
    (7, []),
    (1, None),
]


def make_pack(records: list[tuple[int, list[int] | None]], seed: int = 0) -> list[dict]:  # type: ignore[type-arg]
    return span_pack(records, vocab=5000, low=1, seed=seed)


def expected_targets(n: int, spans: list[int] | None) -> list[int]:
    """Trained positions, written from the contract: inside a span, and t >= 1."""
    if spans is None:
        return list(range(1, n))
    inside = {t for s, e in zip(spans[::2], spans[1::2], strict=True) for t in range(s, e)}
    return sorted(t for t in inside if t >= 1)


def trained_pairs(batch: dict, labels: str) -> list[tuple[int, int, int]]:  # type: ignore[type-arg]
    """(row, position of the predicted token, its id) for every trained target. Unshifted:
    labels[t] is token t itself (the model's shift predicts it from t - 1); shifted: labels[t]
    is token t + 1."""
    lab = batch["labels"]
    offset = 0 if labels == "unshifted" else 1
    rows, cols = torch.nonzero(lab != IGNORE_INDEX, as_tuple=True)
    return [(int(r), int(c) + offset, int(lab[r, c])) for r, c in zip(rows, cols, strict=True)]


@pytest.mark.parametrize("labels", ["shifted", "unshifted"])
def test_packed_labels_train_exactly_the_masked_positions(labels: str) -> None:
    pack = make_pack(RECORDS)
    batch = collate_packed(pack, labels=labels)
    cu = batch["cu_seqlens"].tolist()
    want = [
        (0, cu[i] + t, int(pack[i]["input_ids"][t]))
        for i, (n, spans) in enumerate(RECORDS)
        for t in expected_targets(n, spans)
    ]
    assert trained_pairs(batch, labels) == want
    counts = [len(expected_targets(n, spans)) for n, spans in RECORDS]
    assert batch["trained_tokens"].tolist() == counts
    assert int(batch["loss_tokens"]) == sum(counts)


@pytest.mark.parametrize("labels", ["shifted", "unshifted"])
def test_padded_labels_train_exactly_the_masked_positions(labels: str) -> None:
    pack = make_pack(RECORDS, seed=1)
    batch = collate_padded(pack, labels=labels)
    want = [
        (row, t, int(pack[row]["input_ids"][t]))
        for row, (n, spans) in enumerate(RECORDS)
        for t in expected_targets(n, spans)
    ]
    assert trained_pairs(batch, labels) == want
    assert int(batch["loss_tokens"]) == len(want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_keys_equal_hugging_face_flattening_collator(seed: int) -> None:
    pack = make_pack(RECORDS, seed=seed)
    ours = collate_packed(pack, labels="unshifted")
    features = [
        {
            "input_ids": r["input_ids"].tolist(),
            # what an SFT dataset gives the HF collator: -100 where not trained
            "labels": [
                int(x) if t in expected_targets(n, spans) else IGNORE_INDEX
                for t, x in enumerate(r["input_ids"])
            ],
        }
        for r, (n, spans) in zip(pack, RECORDS, strict=True)
    ]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    assert "attention_mask" not in ours and "attention_mask" not in theirs
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype, key
            assert torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key


def test_truncation_cuts_the_mask_with_the_tokens() -> None:
    pack = make_pack([(9, [2, 4, 6, 9]), (5, None)])
    batch = collate_packed(pack, max_seq_len=5)
    # record 0 keeps positions 0..4: targets 2, 3 (6..8 are cut); record 1 keeps all: 1..4
    assert batch["trained_tokens"].tolist() == [2, 4]
    assert batch["truncated_tokens"].tolist() == [4, 0]


@pytest.mark.parametrize(("spans", "problem"), BAD_SPANS)
def test_malformed_mask_names_the_record(spans: list[int], problem: str) -> None:
    pack = make_pack([(5, None), (10, spans)])
    pack[1]["sample_id"] = 4242
    with pytest.raises(DatasetError, match=f"sample 4242: loss_spans .*{problem}.*preprocessing"):
        collate_packed(pack)


def test_step_count_from_the_reader_reaches_the_batch() -> None:
    collate = PackCollate("packed", (np.ones(10),))
    pack = make_pack([(3, None), (4, None)])
    assert STEP_LOSS_TOKENS not in collate(pack)
    for record in pack:
        record[STEP_LOSS_TOKENS] = 17
    assert int(collate(pack)[STEP_LOSS_TOKENS]) == 17
    pack[1][STEP_LOSS_TOKENS] = 18
    with pytest.raises(DatasetError, match="different step_loss_tokens"):
        collate(pack)
