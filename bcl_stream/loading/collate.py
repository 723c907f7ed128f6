"""Collate one pack (exactly B records) into a batch, padded or packed, for TinyGPT or a
Hugging Face causal LM.

Why two layouts: ``collate_padded`` is what any trainer accepts, but it computes on B*max(L)
tokens, so a pack's cost depends on its longest record; ``collate_packed`` (varlen, one row
with ``cu_seqlens``) computes on sum(L) tokens and attention per record, which is what the
per-record cost model c(L) = a*L + b*L^2 + k describes (flash-attn varlen on GPUs).

Input: ``pack`` is a list of B dicts, each with ``"input_ids"`` (1-D integer np.ndarray, the
record's token ids, uint32 in our shards), ``"sample_id"`` (int, the global record id) and,
for SFT data, ``"loss_spans"`` (the trained positions, ``loss_mask.py``; without it every
token is trained).

Output (both layouts): ``input_ids``, ``labels``, ``sample_ids`` (LongTensor (B,)) and
``tokens`` (LongTensor (B,), the tokens fed per record) so loggers can audit every record,
``truncated_tokens`` (LongTensor (B,), tokens cut by ``max_seq_len``; all 0 without it),
``trained_tokens`` (LongTensor (B,), targets per record) and ``loss_tokens`` (their sum: what
a per-token mean of this batch divides by). Padded adds ``attention_mask`` (B, T); packed adds
``cu_seqlens`` (B+1,), ``position_ids`` and Hugging Face's padding-free keys
(``cu_seq_lens_q``/``cu_seq_lens_k``, ``max_length_q``/``max_length_k``, exactly as
``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` makes them), and no
``attention_mask``: a packed row needs attention kept inside each record, which a 2-D mask
cannot say.

Labels, two conventions (``labels=``), -100 wherever no target is trained (outside the loss
mask, on padding, at position 0 of a record):

- ``"shifted"`` (default, what TinyGPT takes): ``labels[t]`` is the target of position ``t``,
  the next token of the same record; -100 at each record's last token and on padding. The
  loss is ``cross_entropy(logits, labels, ignore_index=-100)`` with no further shift.
- ``"unshifted"`` (Hugging Face convention: the model shifts inside its loss, comparing
  ``logits[..., :-1]`` with ``labels[..., 1:]``): ``labels`` equals ``input_ids`` where trained,
  -100 on padding and on the first token of every record, so the model's own shift never asks
  the last token of one record to predict the first of the next one (the rule of
  ``transformers.DataCollatorWithFlattening``). Either way the same (position, target) pairs
  are trained; a loss that shifts again on ``"shifted"`` labels trains on wrong targets.

The full key/shape/dtype table is in docs/lightning.md ("The batch").

Truncation is explicit: with ``max_seq_len=N`` a record keeps its first N tokens (and the mask
of those) and the cut is reported in ``truncated_tokens``; without it nothing is cut (TinyGPT
raises on a record longer than its ``max_seq_len``, naming the record id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from bcl_stream.cost import resolve
from bcl_stream.epoch.loss_tokens import RANK_STEP_LOSS_TOKENS, STEP_LOSS_TOKENS
from bcl_stream.epoch.mixture_index import MixtureIndex
from bcl_stream.epoch.plan import PlanData
from bcl_stream.epoch.terms import two_term_costs
from bcl_stream.epoch.truncation import fed_costs
from bcl_stream.errors import DatasetError
from bcl_stream.formats.reader_base import Pack
from bcl_stream.loading.loss_mask import target_mask
from bcl_stream.planner.padded import LAYOUTS
from bcl_stream.vision.cost import resolve_two_term

IGNORE_INDEX = -100
LABELS = ("shifted", "unshifted")


def _records(
    pack: Sequence[Mapping[str, Any]], max_seq_len: int | None
) -> tuple[list[Tensor], list[Tensor], list[int], list[int]]:
    """Validated token tensors (int64), their target masks (bool, as kept), record ids, and
    tokens cut per record."""
    if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 1):
        raise ValueError(f"max_seq_len must be an integer >= 1 or None, got {max_seq_len!r}")
    if len(pack) == 0:
        raise ValueError("cannot collate an empty pack (a pack holds exactly B >= 1 records)")
    ids: list[Tensor] = []
    masks: list[Tensor] = []
    sample_ids: list[int] = []
    cut: list[int] = []
    for position, record in enumerate(pack):
        if "input_ids" not in record or "sample_id" not in record:
            raise DatasetError(
                f"record {position} of the pack has keys {sorted(record)}; collate needs "
                "'input_ids' and 'sample_id' (read the dataset with the bcl-stream readers)"
            )
        sample_id = int(record["sample_id"])
        arr = np.asarray(record["input_ids"])
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise DatasetError(
                f"sample {sample_id}: input_ids must be a 1-D integer array, got "
                f"{arr.dtype} {arr.shape}; re-run preprocessing on this dataset"
            )
        keep = arr if max_seq_len is None else arr[:max_seq_len]
        mask = target_mask(record, int(arr.size), sample_id)[: keep.size]
        ids.append(torch.from_numpy(keep.astype(np.int64)))
        masks.append(torch.from_numpy(mask))
        sample_ids.append(sample_id)
        cut.append(int(arr.size - keep.size))
    return ids, masks, sample_ids, cut


def _shifted(ids: Tensor, mask: Tensor) -> Tensor:
    """Next-token targets of one record: ``labels[t-1] = ids[t]`` where position t is trained;
    -100 elsewhere, the last position included."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:-1] = torch.where(mask[1:], ids[1:], IGNORE_INDEX)
    return labels


def _unshifted(ids: Tensor, mask: Tensor) -> Tensor:
    """The record's own ids where trained (the model shifts), -100 elsewhere: always at its
    first token, the target a packed row's shift would otherwise take from the previous
    record (and which a padded row's shift never uses)."""
    return torch.where(mask, ids, IGNORE_INDEX)


def _labels(ids: Tensor, mask: Tensor, labels: str) -> Tensor:
    return _shifted(ids, mask) if labels == "shifted" else _unshifted(ids, mask)


def _check_labels(labels: str) -> None:
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")


def _audit(
    ids: list[Tensor],
    masks: list[Tensor],
    sample_ids: list[int],
    cut: list[int],
    pack: Sequence[Mapping[str, Any]],
) -> dict[str, Tensor]:
    trained = torch.tensor([int(m.sum()) for m in masks], dtype=torch.long)
    out = {
        "sample_ids": torch.tensor(sample_ids, dtype=torch.long),
        "tokens": torch.tensor([t.numel() for t in ids], dtype=torch.long),
        "truncated_tokens": torch.tensor(cut, dtype=torch.long),
        "trained_tokens": trained,
        "loss_tokens": trained.sum(),
    }
    if all("stream" in record for record in pack):  # a mixture: whose record each one is
        out["streams"] = torch.tensor([int(r["stream"]) for r in pack], dtype=torch.long)
    return out


def collate_padded(
    pack: Sequence[Mapping[str, Any]], max_seq_len: int | None = None, labels: str = "shifted"
) -> dict[str, Tensor]:
    """Right-padded (B, T) batch, T = the longest record of the pack (at least 1); padding id 0."""
    _check_labels(labels)
    ids, masks, sample_ids, cut = _records(pack, max_seq_len)
    width = max(1, max(t.numel() for t in ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    targets = torch.full((len(ids), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros(len(ids), width, dtype=torch.long)
    for row, (t, m) in enumerate(zip(ids, masks, strict=True)):
        n = t.numel()
        input_ids[row, :n] = t
        targets[row, :n] = _labels(t, m, labels)
        attention[row, :n] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": targets,
        **_audit(ids, masks, sample_ids, cut, pack),
    }


def collate_packed(
    pack: Sequence[Mapping[str, Any]], max_seq_len: int | None = None, labels: str = "shifted"
) -> dict[str, Any]:
    """One (1, sum L) row; ``cu_seqlens`` (B+1,) marks record boundaries (int32, as flash-attn),
    repeated as Hugging Face's ``cu_seq_lens_q``/``_k`` with ``max_length_q``/``_k`` (ints)."""
    _check_labels(labels)
    ids, masks, sample_ids, cut = _records(pack, max_seq_len)
    lengths = torch.tensor([t.numel() for t in ids], dtype=torch.int32)
    cu_seqlens = torch.zeros(len(ids) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
    positions = [torch.arange(t.numel(), dtype=torch.long) for t in ids]
    longest = int(lengths.max())
    return {
        "input_ids": torch.cat(ids)[None, :],
        "cu_seqlens": cu_seqlens,
        "position_ids": torch.cat(positions)[None, :],
        "labels": torch.cat([_labels(t, m, labels) for t, m in zip(ids, masks, strict=True)])[
            None, :
        ],
        "cu_seq_lens_q": cu_seqlens.clone(),
        "cu_seq_lens_k": cu_seqlens.clone(),
        "max_length_q": longest,
        "max_length_k": longest,
        **_audit(ids, masks, sample_ids, cut, pack),
    }


def _step_loss_tokens(pack: Pack, key: str) -> int | None:
    """The step's trained-token count the reader put on every record of the pack under ``key``
    (None when the plan does not know it: ``epoch/loss_tokens.py``)."""
    values = {record.get(key) for record in pack}
    if values == {None}:
        return None
    if len(values) != 1 or None in values:
        raise DatasetError(
            f"the records of one pack carry different {key} ({sorted(map(str, values))}); "
            "a pack belongs to one step: read the dataset with the bcl-stream readers"
        )
    return int(values.pop())  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PackCollate:
    """Pack -> batch dict with the pack's estimated cost (``est_cost``, the planner's costs, for
    ``PackLogger``). Module level and frozen: picklable for worker processes.

    ``layout`` is also the cost the planner must balance (``PlanConfig.layout``, the same
    names): a padded batch costs B x its costliest record, a packed one the sum of its
    records' costs (docs/layouts.md). ``BCLDataModule`` plans with this layout."""

    layout: str
    costs: tuple[npt.NDArray[np.floating[Any]], ...]
    """Per-record estimated costs by record id, one array per stream (one for one dataset)."""
    max_seq_len: int | None = None
    labels: str = "shifted"
    step_records: int | None = None
    """Under ``contract="step"``: B, the mean records per micro-batch. Each batch then carries
    ``loss_scale`` = its records / B: a micro-batch's mean loss times it, accumulated over G
    micro-batches with Lightning's 1/G, weighs every record of the step as the ``pack``
    contract does (docs/lightning.md, "Variable micro-batches")."""

    @classmethod
    def for_dataset(
        cls,
        index: PlanData,
        cost_model: str | None,
        layout: str,
        max_seq_len: int | None = None,
        labels: str = "shifted",
        *,
        step_records: int | None = None,
    ) -> PackCollate:
        """The collate of a reader over ``index`` (a cost index or a mixture), costs under
        ``cost_model`` (None: the stored ones; a mixture: each stream's own model), records
        longer than ``max_seq_len`` at their truncated cost, as the planner costs them."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        _check_labels(labels)
        two_term = resolve_two_term(cost_model)
        if two_term is not None:  # image-text data: vision + language (epoch/terms.py)
            summed = two_term_costs(index, two_term, max_seq_len)[0]
            return cls(layout, (summed,), max_seq_len, labels, step_records)
        model = None if cost_model is None else resolve(cost_model)
        if isinstance(index, MixtureIndex):
            models = index.stream_models(model)
            view = fed_costs(index, models, index.costs(model), max_seq_len)
            costs = tuple(view.parts)
        else:
            costs = (fed_costs(index, [model], index.costs(model), max_seq_len),)
        return cls(layout, costs, max_seq_len, labels, step_records)

    def __call__(self, pack: Pack) -> dict[str, Any]:
        fn = collate_packed if self.layout == "packed" else collate_padded
        batch = fn(pack, self.max_seq_len, self.labels)
        if self.step_records is not None:
            batch["loss_scale"] = torch.tensor(len(pack) / self.step_records)
        for key in (STEP_LOSS_TOKENS, RANK_STEP_LOSS_TOKENS):
            step = _step_loss_tokens(pack, key)
            if step is not None:
                batch[key] = torch.tensor(step, dtype=torch.long)
        ids = batch["sample_ids"].numpy()
        streams = batch["streams"].numpy() if "streams" in batch else np.zeros_like(ids)
        cost = sum(float(self.costs[s][i]) for s, i in zip(streams, ids, strict=True))
        batch["est_cost"] = torch.tensor(cost, dtype=torch.float64)
        return batch
