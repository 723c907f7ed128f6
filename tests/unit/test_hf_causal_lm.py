"""HFCausalLM on packed batches: the loss of a pack equals the token-weighted loss of its
records run alone (attention stays inside each record), in both label conventions, with sdpa
and eager attention; padded batches too; weights load when the directory has them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sft_records import span_pack

from bcl_stream.loading.collate import collate_packed, collate_padded
from lightning_module.hf_causal_lm import HFCausalLM, has_weights
from tests.hf_models import tiny_llama_dir

RECORDS = [(11, [3, 7, 9, 11]), (6, None), (9, [0, 4]), (3, [1, 3]), (14, [5, 14])]


def tiny_model_dir(root: Path) -> Path:
    return tiny_llama_dir(root)


def make_pack(seed: int = 0) -> list[dict]:  # type: ignore[type-arg]
    return span_pack(RECORDS, vocab=96, seed=seed)


def alone(module: HFCausalLM, pack: list[dict]) -> tuple[float, int]:  # type: ignore[type-arg]
    """Summed CE and target count over the records, each run by itself through the bare HF
    model (no mask, no packing): position t - 1 predicts token t where t is trained."""
    total, count = 0.0, 0
    for record, (n, spans) in zip(pack, RECORDS, strict=True):
        ids = torch.as_tensor(record["input_ids"].astype(np.int64))[None]
        logits = module.model(input_ids=ids).logits.float()[0]
        trained = np.zeros(n, dtype=bool)
        if spans is None:
            trained[:] = True
        else:
            for s, e in zip(spans[::2], spans[1::2], strict=True):
                trained[s:e] = True
        trained[0] = False
        targets = torch.as_tensor(np.flatnonzero(trained))
        if targets.numel():
            total += float(F.cross_entropy(logits[targets - 1], ids[0, targets], reduction="sum"))
        count += int(targets.numel())
    return total, count


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("labels", ["shifted", "unshifted"])
@pytest.mark.parametrize("collate", [collate_packed, collate_padded])
def test_loss_of_a_pack_equals_its_records_run_alone(
    tmp_path: Path, attention: str, labels: str, collate
) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    module = HFCausalLM(str(tiny_model_dir(tmp_path)), attention=attention, labels=labels)
    module.eval()
    pack = make_pack()
    batch = collate(pack, labels=labels)
    with torch.no_grad():
        total, count = alone(module, pack)
        loss = module.loss(batch)
    assert int(batch["loss_tokens"]) == count
    assert float(loss) == pytest.approx(total / count, rel=1e-5)


def test_without_the_block_mask_records_would_see_each_other(tmp_path: Path) -> None:
    """The check above can fail: the same packed row without the mask gives a loss more than
    ten times its tolerance (1e-5 relative) away (a random tiny model predicts nearly uniformly,
    so the gap is small in absolute terms: at least 0.001, 0.007 on average over 20 packs)."""
    torch.manual_seed(0)
    module = HFCausalLM(str(tiny_model_dir(tmp_path)), attention="sdpa", labels="unshifted")
    module.eval()
    batch = collate_packed(make_pack(), labels="unshifted")
    with torch.no_grad():
        masked = float(module.loss(batch))
        out = module.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        logits = out.logits.float()[:, :-1]
        labels = batch["labels"][:, 1:]
        crossing = float(F.cross_entropy(logits.reshape(-1, 96), labels.reshape(-1)))
    assert abs(masked - crossing) / masked > 1e-4


def test_weights_load_when_present_and_the_config_alone_inits_at_random(tmp_path: Path) -> None:
    directory = tiny_model_dir(tmp_path / "m")
    assert not has_weights(directory)
    torch.manual_seed(1)
    first = HFCausalLM(str(directory), attention="sdpa")
    first.model.save_pretrained(directory)
    assert has_weights(directory)
    torch.manual_seed(2)
    loaded = HFCausalLM(str(directory), attention="sdpa")
    for a, b in zip(first.model.parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert loaded.max_seq_len == 64


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        HFCausalLM(str(tmp_path))


class _Dim:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size

    def get_group(self) -> str:
        return f"group-of-{self._size}"


class _Mesh:
    """A stand-in 2 DP x 4 TP device mesh (only what HFCausalLM reads of it)."""

    mesh_dim_names = ("data_parallel", "tensor_parallel")

    def __getitem__(self, name: str) -> _Dim:
        return _Dim({"data_parallel": 2, "tensor_parallel": 4}[name])


class _Strategy:
    def __init__(self, mesh: _Mesh | None) -> None:
        self.device_mesh = mesh


class _Trainer:
    world_size = 8
    accumulate_grad_batches = 1

    def __init__(self, mesh: _Mesh | None) -> None:
        self.strategy = _Strategy(mesh)


@pytest.mark.parametrize(("mesh", "expected"), [(_Mesh(), (2, "group-of-2")), (None, (8, None))])
def test_the_loss_scale_counts_data_parallel_ranks_not_processes(
    tmp_path: Path, mesh: _Mesh | None, expected: tuple[int, str | None]
) -> None:
    # 8 processes as 2 data-parallel ranks x 4 tensor-parallel peers: the peers hold the same
    # records, so gradients average over 2 ranks and the step's tokens are summed over 2.
    module = HFCausalLM(str(tiny_model_dir(tmp_path)))
    module._trainer = _Trainer(mesh)  # type: ignore[assignment]
    assert module._data_parallel() == expected
