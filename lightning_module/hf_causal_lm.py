"""``HFCausalLM``: a LightningModule for any local Hugging Face causal LM, trained on BCL packs.

Why a module of its own: a packed batch (one row of B records) given to a Hugging Face model
as it is attends across records with sdpa or eager attention (measured: logits 8.7 away from
the records run alone, transformers 4.57), and the model's own loss divides by the batch's
targets, not by the optimizer step's. This module keeps attention inside each record and
divides by the step's trained tokens:

- **Attention inside each record.** Packed batches (``cu_seqlens`` present): with
  ``flash_attention_2`` (CUDA and the ``flash_attn`` package) the padding-free keys the collate
  makes (``position_ids``, ``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``) go to the model,
  whose flash-attention varlen path uses them; with ``sdpa``/``eager`` (CPU) a block-diagonal
  causal mask (1, 1, N, N) is built from ``cu_seqlens`` (boolean for sdpa, additive for eager),
  which costs (sum L)^2 memory and time: for CPU tests and small runs. Padded batches use their
  ``attention_mask``.
- **Loss.** :meth:`loss` is the mean cross-entropy over the batch's trained tokens (labels
  other than -100), in float32. ``training_step`` divides the batch's summed loss by the
  optimizer step's trained tokens over every rank and micro-batch, taken from where the plan
  puts it (``bcl_stream/epoch/loss_tokens.py``): ``step_loss_tokens`` on the batch (no
  communication); or ``rank_step_loss_tokens``, the rank's planned share, all-reduced once at
  the step's first micro-batch; or, where the index cannot know the count, the summed losses
  are backpropagated and, before the optimizer step (and before gradient clipping), one
  all-reduce of the counts in the labels rescales the gradients. Each way DDP with
  accumulation G gives the gradient of one process on the whole step (tests check all three).
- **Labels.** Both collate conventions work; ``labels=None`` follows the data's, read from the
  core's resolved config (``trainer.datamodule.resolved``, a ``bcl_stream.ResolvedTraining``:
  ``BCLDataModule`` sets it at ``setup``), never from the DataModule class; an explicit value
  that contradicts it is refused.

**Vision-language models** (tested with Qwen2-VL). A ``config.json`` with a ``vision_config``
is built with ``AutoModelForImageTextToText`` (``AutoModelForCausalLM`` does not map them), and
the batch's image keys (``pixel_values``, ``image_grid_thw``: what ``ImageCollate`` adds,
bcl_stream/vision/batch.py) go to the model beside the ids. Packed rows carry Qwen2-VL's 3-D
rotary positions ``(3, 1, N)``, each record's from 0 as it has them alone, and the same
block-diagonal mask as text; padded rows leave the positions to the model (its rope index from
the ``attention_mask``). The loss is the text path's: a record's packed loss is its loss alone.
A micro-batch without images leaves the vision tower out of the graph, and DDP, which reduces
every parameter's gradient, then waits on one rank for buckets the others have sent (the ranks
part: a gloo "connection closed", or a hang). So in training 0 times the first element of each
vision parameter is added to such a batch's loss (in float32; a sum of the tower's parameters
overflows float16 to inf, and inf times 0 is NaN): their gradient there is exactly 0, the loss
unchanged, and every rank reduces the same buckets. Its cost is one element read per parameter
and the zero gradients DDP reduces anyway. ``find_unused_parameters=True`` gives the same
gradients but walks the autograd graph on every step and is a strategy setting users would have
to know; ``static_graph`` is wrong here (the set of used parameters changes from batch to
batch). One consequence: the vision parameters' gradient is 0, never None, so on a step with
no image on any rank an optimizer with momentum or weight decay (AdamW) still moves them, as it
does on any zero-gradient step, where an optimizer skips a parameter whose gradient is None.

The model directory needs ``config.json``; with weights (``model.safetensors``,
``pytorch_model.bin`` or their sharded indexes) they are loaded, without them the model is
initialised at random from the config (tests, from-scratch runs). Every rank loads the model on
the CPU before the strategy places or shards it. The loaded model is put in training mode
(``from_pretrained`` leaves it in eval mode and Lightning keeps submodule modes as it finds
them), so dropout runs and ``gradient_checkpointing`` recomputes each layer in backward.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from bcl_stream.training import (
    IGNORE_INDEX,
    LABELS,
    RANK_STEP_LOSS_TOKENS,
    STEP_LOSS_TOKENS,
    ResolvedTraining,
)
from lightning_module.tinygpt import block_causal_mask
from lightning_module.trainer_layout import data_parallel_dim, strategy_mesh

ATTENTION = ("auto", "flash_attention_2", "sdpa", "eager")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
IMAGE_KEYS = ("pixel_values", "image_grid_thw")
"""The batch keys of a vision-language model's images (``ImageCollate``'s), passed as they are."""


def has_weights(directory: str | Path) -> bool:
    """Whether a model directory holds weights (else it is initialised from its config)."""
    return any((Path(directory) / name).is_file() for name in WEIGHT_FILES)


def resolve_attention(requested: str) -> str:
    """``auto``: flash-attention 2 where it can run (CUDA and ``flash_attn``), else sdpa."""
    if requested not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {requested!r}")
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def packed_mask(cu_seqlens: Tensor, *, additive: bool, dtype: torch.dtype) -> Tensor:
    """(1, 1, N, N) block-diagonal causal mask of a packed row (TinyGPT's): query i sees key j
    iff both lie in the same record and j <= i. ``additive``: 0 where seen and the dtype's
    minimum elsewhere (eager attention adds it to the scores); otherwise boolean (sdpa)."""
    seen = block_causal_mask(cu_seqlens)[None, None]
    if not additive:
        return seen
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
    return mask.masked_fill(~seen, torch.finfo(dtype).min)


class HFCausalLM(L.LightningModule):
    """Train a local Hugging Face causal LM on BCL batches (see the module docstring).

    Args:
        model: a local model directory with ``config.json`` (weights optional).
        attention: ``auto`` (flash-attention 2 on CUDA with ``flash_attn``, else sdpa),
            ``flash_attention_2``, ``sdpa`` or ``eager``.
        dtype: the parameters' dtype when loaded (``float32``, ``bfloat16``, ``float16``);
            None: float32. With ``precision: bf16-mixed`` keep float32 parameters.
        labels: the batches' label convention (``shifted`` or ``unshifted``); None follows the
            DataModule's.
        max_seq_len: the longest record the model is trained on; None: the config's
            ``max_position_embeddings``. The DataModule truncates records to it and plans
            their truncated cost.
        lr, weight_decay, betas: AdamW.
        gradient_checkpointing: recompute activations in backward (Hugging Face's).
    """

    def __init__(
        self,
        model: str,
        *,
        attention: str = "auto",
        dtype: str | None = None,
        labels: str | None = None,
        max_seq_len: int | None = None,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

        if not (Path(model) / "config.json").is_file():
            raise FileNotFoundError(
                f"HFCausalLM: {model}: no config.json; give a local Hugging Face model directory "
                "(save_pretrained's output, or a config.json alone for a random init)"
            )
        if labels is not None and labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS} or None, got {labels!r}")
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} or None, got {dtype!r}")
        # "_class_path": the CLI's model type is any LightningModule; on --ckpt_path it
        # rebuilds the model from these hyperparameters (see TinyGPT).
        self.save_hyperparameters(
            {
                "model": model,
                "attention": attention,
                "dtype": dtype,
                "labels": labels,
                "max_seq_len": max_seq_len,
                "lr": lr,
                "weight_decay": weight_decay,
                "betas": list(betas),
                "gradient_checkpointing": gradient_checkpointing,
                "_class_path": f"{__name__}.{type(self).__qualname__}",
            }
        )
        self.attention = resolve_attention(attention)
        config = AutoConfig.from_pretrained(model)
        torch_dtype = DTYPES[dtype] if dtype is not None else torch.float32
        options: dict[str, Any] = {"attn_implementation": self.attention, "dtype": torch_dtype}
        self.vision = getattr(config, "vision_config", None) is not None
        """A vision-language model (module docstring): built as image-text-to-text."""
        auto = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
        if has_weights(model):
            self.model = auto.from_pretrained(model, config=config, **options)
        else:
            self.model = auto.from_config(config, **options)
        # from_pretrained returns the model in eval mode, and Lightning (since 2.2) keeps each
        # submodule's mode as it finds it at fit: without this the whole fit would run without
        # dropout, and transformers, which checkpoints only while ``self.training``, would not
        # recompute a layer under gradient_checkpointing (the memory plan would be wrong).
        self.model.train()
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        limit = getattr(config.get_text_config(), "max_position_embeddings", None)
        self.max_seq_len: int | None = max_seq_len if max_seq_len is not None else limit
        """The longest record trained (the DataModule truncates to it and plans for it)."""
        self.labels = labels
        self.lr, self.weight_decay = lr, weight_decay
        self.betas = (float(betas[0]), float(betas[1]))
        self._path: str | None = None
        """The current step's normalization (``plan``, ``all_reduce``, ``rescale``)."""
        self._step_total = 0
        """The current step's trained tokens over every rank (``plan`` and ``all_reduce``)."""
        self._step_tokens = 0
        """Trained tokens of this rank's micro-batches of the current step (``rescale``)."""

    # -- set-up ---------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        resolved = getattr(getattr(self.trainer, "datamodule", None), "resolved", None)
        if not isinstance(resolved, ResolvedTraining):
            return  # another DataModule: its batches follow this module's ``labels``
        data_labels = resolved.labels
        if self.labels is not None and self.labels != data_labels:
            raise ValueError(
                f"HFCausalLM labels={self.labels!r} contradicts the DataModule's "
                f"labels={data_labels!r}; the batches follow the DataModule: drop model.labels "
                "or make them equal"
            )
        self.labels = data_labels

    # -- forward and loss -----------------------------------------------------------------
    def forward(self, batch: dict[str, Any]) -> Tensor:
        """Logits (float32) shaped like ``input_ids`` plus a vocabulary axis."""
        ids = batch["input_ids"].long()
        images = {key: batch[key] for key in IMAGE_KEYS if key in batch}
        if images and not self.vision:
            raise ValueError(
                f"the batch carries images ({sorted(images)}) but the model "
                f"{self.hparams['model']} has no vision_config: train image-text data with a "
                "vision-language model"
            )
        if "cu_seqlens" not in batch:
            out = self.model(input_ids=ids, attention_mask=batch.get("attention_mask"), **images)
            return out.logits.float()
        if ids.shape[0] != 1:
            raise ValueError(
                f"packed layout needs input_ids of shape (1, N), got {tuple(ids.shape)}"
            )
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "position_ids": batch["position_ids"].long(),
            **images,
        }
        if self.attention == "flash_attention_2":
            for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
                kwargs[key] = batch[key]
        else:
            device = ids.device.type
            autocast = torch.is_autocast_enabled(device)
            dtype = torch.get_autocast_dtype(device) if autocast else self.model.dtype
            kwargs["attention_mask"] = packed_mask(
                batch["cu_seqlens"].to(ids.device), additive=self.attention == "eager", dtype=dtype
            )
        return self.model(**kwargs).logits.float()

    def loss_sum(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """(summed cross-entropy over the trained tokens, their count) of one batch."""
        logits = self(batch)
        labels = batch["labels"].long().to(logits.device)
        if (self.labels or "unshifted") == "unshifted":  # the model's shift
            logits, labels = logits[:, :-1], labels[:, 1:]
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        if self.vision and torch.is_grad_enabled() and not any(k in batch for k in IMAGE_KEYS):
            total = total + self._vision_zero()
        return total, (labels != IGNORE_INDEX).sum()

    def _vision_zero(self) -> Tensor:
        """0, with every trainable parameter outside the language model (the vision tower and
        its projector) in its graph: added to an image-free batch's loss (module docstring).
        Each parameter's first element times 0, in float32: exactly 0 for any finite weights,
        and one element read per parameter. A sum of the parameters would read the whole tower
        and, in float16, overflow (Qwen2-VL-7B's 32 blocks of LayerNorm weights alone sum to
        about 82,000, past float16's 65,504): inf times 0 is NaN, a NaN loss."""
        model = self.model
        language = {id(p) for p in model.get_decoder().parameters()}
        language |= {id(p) for p in model.get_output_embeddings().parameters()}
        firsts = [
            p.reshape(-1)[0]
            for p in model.parameters()
            if p.requires_grad and id(p) not in language
        ]
        if not firsts:
            return torch.zeros((), device=self.device)
        return (torch.stack(firsts).float() * 0.0).sum()

    def loss(self, batch: dict[str, Any]) -> Tensor:
        """Mean cross-entropy over the batch's trained tokens."""
        total, count = self.loss_sum(batch)
        return total / count.clamp(min=1)

    # -- training -------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        total, count = self.loss_sum(batch)
        records = int(batch["sample_ids"].numel()) if "sample_ids" in batch else 1
        self.log("train_loss", total.detach() / count.clamp(min=1), prog_bar=True,
                 batch_size=records)  # fmt: skip
        # Lightning divides what this returns by G (accumulation) and DDP averages gradients
        # over W ranks; times W*G over the step's trained tokens, the step's gradient is that of
        # the summed loss over all of them divided by their count.
        scale = self._data_parallel()[0] * self.trainer.accumulate_grad_batches
        denominator = self._denominator(batch)
        if denominator is not None:
            return total * (scale / max(denominator, 1))
        if self._path not in (None, "rescale"):
            raise RuntimeError(
                "a batch without step_loss_tokens or rank_step_loss_tokens inside a step whose "
                "other micro-batches carried one; read the data with BCLDataModule"
            )
        self._path = "rescale"
        self._step_tokens += int(count)
        return total  # rescaled in on_before_optimizer_step, after one all-reduce

    def _denominator(self, batch: dict[str, Any]) -> int | None:
        """The step's trained tokens over every rank, from the batch (``plan``) or from one
        all-reduce of the ranks' planned counts at the step's first micro-batch
        (``all_reduce``); None: neither is known (``rescale``)."""
        if STEP_LOSS_TOKENS in batch:
            path, value = "plan", int(batch[STEP_LOSS_TOKENS])
        elif RANK_STEP_LOSS_TOKENS in batch:
            path = "all_reduce"
            if self._path == path:
                return self._step_total
            own = torch.tensor(float(batch[RANK_STEP_LOSS_TOKENS]), device=self.device)
            self._sum_over_data_parallel(own)
            value = int(own.item())
        else:
            return None
        if self._path not in (None, path):
            raise RuntimeError(
                f"micro-batches of one step disagree on the loss denominator ({self._path} then "
                f"{path}); read the data with BCLDataModule"
            )
        self._path, self._step_total = path, value
        return value

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """The end of a step. On the ``rescale`` path: the step's trained tokens over every
        rank, one scalar, then the gradients times W*G / that count (before Lightning clips
        them). Which path a step takes is decided by the plan alike on every rank, so every
        rank joins the collective."""
        path, self._path = self._path, None
        if path != "rescale":
            return
        count = torch.tensor(float(self._step_tokens), device=self.device)
        self._sum_over_data_parallel(count)
        self._step_tokens = 0
        scale = self._data_parallel()[0] * self.trainer.accumulate_grad_batches
        factor = scale / max(float(count), 1.0)
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)

    def _data_parallel(self) -> tuple[int, Any]:
        """(size, process group) of the data-parallel ranks the gradients are averaged over.

        Under a device mesh with a ``data_parallel`` dimension (``ModelParallelStrategy``) the
        processes of one tensor-parallel group hold the same records: counting them once per
        process would multiply the step's denominator by the group size, so the scale and the
        sums run over the mesh's data-parallel dimension only. Elsewhere: every process."""
        dp = data_parallel_dim(strategy_mesh(self.trainer.strategy))
        if dp is not None:
            return int(dp.size()), dp.get_group()
        return int(self.trainer.world_size), None

    def _sum_over_data_parallel(self, value: Tensor) -> None:
        """``value`` summed in place over the data-parallel ranks (one scalar collective)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(value, group=self._data_parallel()[1])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._evaluate("val_loss", batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._evaluate("test_loss", batch)

    def _evaluate(self, name: str, batch: dict[str, Any]) -> Tensor:
        """The mean CE of an evaluation pack, logged weighted by its trained tokens on each
        rank, then averaged over ranks (``sync_dist``: every rank runs the same pack count)."""
        loss = self.loss(batch)
        tokens = max(int(batch["loss_tokens"]), 1) if "loss_tokens" in batch else 1
        self.log(name, loss, prog_bar=True, batch_size=tokens, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        # Deliberately does not read trainer.estimated_stepping_batches (Lightning #20550).
        return torch.optim.AdamW(
            self.parameters(), lr=self.lr, weight_decay=self.weight_decay, betas=self.betas
        )
