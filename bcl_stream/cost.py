"""Cost models: the estimated compute of one record, c(L) = a*L + b*L^2 + k.

Why a quadratic: a transformer's training FLOPs per record are linear in its length L for
every matmul (about 6 FLOPs per parameter per token: 2 forward, 4 backward) plus a term
quadratic in L for attention (QK^T and AV each cost 2*d*L^2 FLOPs per layer forward for full
attention, half of that causal, times 3 for forward+backward: 6*n_layers*d_model*L^2). The
constant k is a per-record overhead that only a measured fit (``fit_cost_model``) can see.

Token counts, not costs, are the ground truth stored with every dataset; a cost model can be
swapped at read time without rewriting shards (``CostModel.cost``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import numpy.typing as npt

FLOPS_PER_PARAM_PER_TOKEN = 6.0  # 2 (forward) + 4 (backward)
COST_MAX = float(np.finfo(np.float32).max)
"""The largest cost a cost index can store: costs are kept as float32 (``bcl_costs.npy``), so
a model whose cost of a record passes this stores ``inf`` and every plan over it fails."""


def check_coefficients(owner: str, a: float, b: float, k: float) -> None:
    """Refuse a coefficient of a*x + b*x^2 + k that is negative or not finite: a negative
    one would rank longer records cheaper, a NaN would poison every plan over it."""
    for field, value in (("a", a), ("b", b), ("k", k)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{owner}.{field} must be finite and >= 0, got {value!r}")


def quadratic_cost(a: float, b: float, k: float, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """a*x + b*x^2 + k for every x (float64): a record's cost from its tokens, an image's
    from its patches."""
    length = np.asarray(x, dtype=np.float64)
    return a * length + b * length * length + k


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The shape of a decoder-only transformer, as its public ``config.json`` gives it."""

    n_layers: int
    """Number of transformer blocks (``num_hidden_layers``)."""
    d_model: int
    """Hidden size (``hidden_size``)."""
    n_heads: int
    """Attention heads (``num_attention_heads``)."""
    n_kv_heads: int
    """Key/value heads (``num_key_value_heads``; grouped-query attention)."""
    ffn_hidden: int
    """Gated MLP width (``intermediate_size``)."""
    vocab_size: int
    """Vocabulary size: the LM head is a d_model x vocab matmul per token."""

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (embedding lookup excluded)."""
        head_dim = self.d_model // self.n_heads
        attn = 2 * self.d_model * self.d_model + 2 * self.d_model * self.n_kv_heads * head_dim
        mlp = 3 * self.d_model * self.ffn_hidden  # gate, up, down
        return self.n_layers * (attn + mlp) + self.d_model * self.vocab_size


@dataclass(frozen=True, slots=True, kw_only=True)
class Coefficients:
    """a*x + b*x^2 + k, named, in one unit: what every cost of this package is (a record's
    cost from its tokens, :class:`CostModel`; an image's from its patches, ``VisionCost``).
    The fields, their check and their JSON form live here once."""

    name: str
    """Preset name or a user label; stored with what it costed."""
    a: float
    """Linear coefficient (per token, or per patch): the matmuls."""
    b: float = 0.0
    """Quadratic coefficient (per token squared, or patch squared): attention."""
    k: float = 0.0
    """Constant overhead per record (or image): only a measured fit sees it."""
    unit: str = "flops"
    """What one unit of cost is: ``flops``, ``tokens`` or ``seconds``."""
    source: str = ""
    """Where the coefficients come from (a config, a fit): for audits."""

    def __post_init__(self) -> None:
        check_coefficients(type(self).__name__, self.a, self.b, self.k)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, stored in ``bcl_index.json`` and in cost-model files."""
        return asdict(self)

    @classmethod
    def fitted(cls, name: str, coef: npt.ArrayLike, source: str) -> Self:
        """(a, b, k) fitted to measured pack times (:func:`held_out_fit`): in seconds."""
        a, b, k = (float(c) for c in np.asarray(coef, dtype=np.float64))
        return cls(name=name, a=a, b=b, k=k, unit="seconds", source=source)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel(Coefficients):
    """c(L) = a*L + b*L^2 + k, in the unit of ``unit`` (FLOPs for presets, seconds when fitted)."""

    def __post_init__(self) -> None:
        Coefficients.__post_init__(self)  # slots dataclasses cannot call super() plainly
        if self.a == 0 and self.b == 0 and self.k == 0:
            raise ValueError("CostModel needs at least one of a, b, k > 0 (all are 0)")

    def cost(self, tokens: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Per-record cost for an array of token counts (float64; exact for the presets)."""
        return quadratic_cost(self.a, self.b, self.k, tokens)

    def first_overflow(self, tokens: npt.ArrayLike) -> int | None:
        """Index of the first token count whose cost is not a finite float32 (what the cost
        index stores: :data:`COST_MAX`), or None when every cost fits."""
        with np.errstate(over="ignore"):
            costs = self.cost(tokens)
        bad = ~(np.abs(costs) <= COST_MAX)  # NaN compares False: counted as bad
        return int(np.flatnonzero(bad)[0]) if bad.any() else None

    def overflow_message(self, tokens: int) -> str:
        """Why a record of ``tokens`` tokens cannot be costed under this model (one clause)."""
        with np.errstate(over="ignore"):
            value = float(self.cost(tokens))
        return (
            f"cost model {self.name!r} gives a record of {tokens} tokens a cost of {value:.4g}, "
            f"beyond the largest storable cost ({COST_MAX:.4g}, float32): every plan over it "
            "would fail; use a cost model with smaller coefficients (another unit)"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        """Inverse of :meth:`to_dict`; unknown keys are an error (they hint at a newer format)."""
        known = {"name", "a", "b", "k", "unit", "source"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"cost model has unknown keys {sorted(unknown)}; expected {sorted(known)}"
            )
        if "name" not in data or "a" not in data:
            raise ValueError(f"cost model needs at least 'name' and 'a', got keys {sorted(data)}")
        return cls(**{key: data[key] for key in data})

    def save(self, path: str | Path) -> None:
        """Write the model as JSON (what ``bcl-stream calibrate`` produces)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a model written by :meth:`save`."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cost model {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(
                f"cost model {path}: expected a JSON object, got {type(data).__name__}"
            )
        try:
            model = cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost model {path}: {exc}") from exc
        if model.first_overflow([1]) is not None:
            raise ValueError(f"cost model {path}: {model.overflow_message(1)}")
        return model


def from_shape(name: str, shape: ModelShape, source: str) -> CostModel:
    """Training-FLOPs cost model of a transformer shape (see the module docstring)."""
    return CostModel(
        name=name,
        a=FLOPS_PER_PARAM_PER_TOKEN * shape.matmul_params(),
        b=6.0 * shape.n_layers * shape.d_model,
        unit="flops",
        source=source,
    )


# Shapes from the models' public Hugging Face config.json files.
SHAPES: dict[str, tuple[ModelShape, str]] = {
    "llama3-8b": (
        ModelShape(
            n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256
        ),
        "meta-llama/Meta-Llama-3-8B config.json",
    ),
    "llama3-70b": (
        ModelShape(
            n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=128256
        ),
        "meta-llama/Meta-Llama-3-70B config.json",
    ),
    "qwen2.5-7b": (
        ModelShape(
            n_layers=28, d_model=3584, n_heads=28, n_kv_heads=4, ffn_hidden=18944, vocab_size=152064
        ),
        "Qwen/Qwen2.5-7B config.json",
    ),
    # The demo's TinyGPT (lightning_module.tinygpt.TinyGPTConfig defaults).
    "tinygpt": (
        ModelShape(
            n_layers=2, d_model=128, n_heads=4, n_kv_heads=4, ffn_hidden=512, vocab_size=8192
        ),
        "lightning_module/tinygpt.py defaults",
    ),
}


def preset_names() -> list[str]:
    """Every name :func:`get_preset` accepts."""
    return ["tokens", *SHAPES]


def get_preset(name: str) -> CostModel:
    """A named cost model: ``tokens`` (c = L) or a model-shape preset."""
    if name == "tokens":
        return CostModel(name="tokens", a=1.0, unit="tokens", source="c = L")
    if name not in SHAPES:
        raise ValueError(
            f"unknown cost model {name!r}; choose one of {preset_names()} or a JSON file"
        )
    shape, source = SHAPES[name]
    return from_shape(name, shape, source)


def resolve(spec: str | CostModel) -> CostModel:
    """A preset name, a path to a cost-model JSON file, or a model: as a :class:`CostModel`."""
    if isinstance(spec, CostModel):
        return spec
    if spec.endswith(".json"):
        return CostModel.load(spec)
    return get_preset(spec)


@dataclass(frozen=True, slots=True)
class Fit:
    """A least-squares fit of pack times: the model and how well it explains held-out packs."""

    model: CostModel
    r2_train: float
    r2_holdout: float
    mean_rel_error_holdout: float


def pack_features(packs: Sequence[npt.ArrayLike]) -> npt.NDArray[np.float64]:
    """(n_packs, 3): sum L, sum L^2 and the record count of every pack, the columns a per-record
    c(L) = a*L + b*L^2 + k sums to over a pack."""
    rows = []
    for pack in packs:
        length = np.asarray(pack, dtype=np.float64)
        rows.append((length.sum(), (length * length).sum(), float(length.size)))
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def nonnegative_lstsq(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Exact non-negative least squares for a few unknowns (every support is tried, the best
    feasible kept: 2^columns solves, meant for 3-4 columns such as a pack's token terms)."""
    best = np.zeros(x.shape[1])
    best_err = float(np.sum(y * y))
    for mask in range(1, 2 ** x.shape[1]):
        cols = [j for j in range(x.shape[1]) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(x.shape[1])
        full[cols] = coef
        err = float(np.sum((x @ full - y) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best


def r2_score(pred: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> float:
    """1 - residual / total sum of squares of ``pred`` against ``y`` (NaN when ``y`` is constant)."""
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class HeldOutFit:
    """Non-negative least squares of pack times on pack features: fitted on the packs not held
    out, scored on both parts. One procedure for every fitted cost model (one term here, two
    in ``bcl_stream.vision.cost``)."""

    coef: npt.NDArray[np.float64]
    """One coefficient per feature column, each >= 0."""
    r2_train: float
    r2_holdout: float
    mean_rel_error_holdout: float
    source: str
    """How the coefficients were found (a cost model's ``source``)."""


def held_out_fit(
    x: npt.NDArray[np.float64],
    seconds: npt.ArrayLike,
    *,
    least: int,
    what: str,
    holdout_fraction: float,
    seed: int,
) -> HeldOutFit:
    """Fit pack times ``seconds`` on the rows of ``x`` (one a pack), keeping a random
    ``holdout_fraction`` of the packs out of the fit to score it. Refuses fewer than ``least``
    packs (``what``: what they would fit, for the message)."""
    y = np.asarray(seconds, dtype=np.float64)
    if x.shape[0] != y.size:
        raise ValueError(f"packs ({x.shape[0]}) and seconds ({y.size}) differ in length")
    if y.size < least:
        raise ValueError(f"need at least {least} measured packs to fit{what}, got {y.size}")
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}")
    perm = np.random.default_rng(seed).permutation(y.size)
    n_hold = max(2, round(holdout_fraction * y.size))
    hold, train = perm[:n_hold], perm[n_hold:]
    coef = nonnegative_lstsq(x[train], y[train])
    pred = x @ coef
    rel = np.abs(pred[hold] - y[hold]) / np.maximum(y[hold], 1e-12)
    return HeldOutFit(
        coef,
        r2_score(pred[train], y[train]),
        r2_score(pred[hold], y[hold]),
        float(rel.mean()),
        f"least squares on {train.size} packs, {n_hold} held out",
    )


def fit_cost_model(
    packs: Sequence[npt.ArrayLike],
    seconds: npt.ArrayLike,
    *,
    name: str = "fitted",
    holdout_fraction: float = 0.25,
    seed: int = 0,
) -> Fit:
    """Fit c(L) = a*L + b*L^2 + k per record from measured pack times (non-negative least squares).

    ``packs[i]`` holds the token counts of the records in pack i, ``seconds[i]`` its measured
    time; a pack's predicted time is the sum of its records' costs. A random ``holdout_fraction``
    of packs is kept out of the fit and scored (R^2 and mean relative error).
    """
    fit = held_out_fit(
        pack_features(packs),
        seconds,
        least=8,
        what="",
        holdout_fraction=holdout_fraction,
        seed=seed,
    )
    model = CostModel.fitted(name, fit.coef, fit.source)
    return Fit(model, fit.r2_train, fit.r2_holdout, fit.mean_rel_error_holdout)
