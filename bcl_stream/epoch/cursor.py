"""Reader state: a cursor into the epoch plan, identical on every rank.

Lightning writes rank 0's loader state only and hands it to every rank on resume, so the
state holds nothing rank-specific: ``{version, epoch, packs_consumed, fingerprint, config,
segments}``. Resume recomputes the plan (a pure function of data, config, seed and epoch) and
skips the consumed packs; no buffer is pickled, so a state is a few hundred bytes of JSON.

:func:`resolve_state` checks a saved state against the data and config it is loaded into.
Anything that would make the replayed plan differ (other data, pack size, seed, ...) is a
:class:`~bcl_stream.errors.StateError` naming the field, both values and what to do. A changed
world size (or ranks per node) is an elastic resume: the old plan becomes a
:class:`~bcl_stream.epoch.plan.Segment` and the rest of the epoch is re-planned.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from bcl_stream.epoch.mixture_index import mixture_changes
from bcl_stream.epoch.plan import ReaderConfig, Segment
from bcl_stream.errors import StateError
from bcl_stream.planner import PlanConfig
from bcl_stream.planner.checks import MAX_COUNT
from bcl_stream.planner.config import MAX_RANKS
from bcl_stream.vision.cost import resolve_two_term

STATE_VERSION = 10
"""10: image-text plans under a two-term cost model may also swap records anywhere in a
window toward cells of equal cost (``two_term_window.window_swapped``), which changes their
packs: a version 9 state or older whose config names a two-term cost model is refused; every
other state of versions 5-9 reads as before (text plans are unchanged).
9: image-text plans under a two-term cost model may also deal a window's records again one
by one (``two_term_regroup.redealt``), and each guard unit's windows choose their candidates
within the unit's budget (``two_term._budgeted``), which changes their packs: a version 8
state or older whose config names a two-term cost model is refused, like version 7's below;
every other state of versions 5-8 reads as before (text plans are unchanged).
8: image-text plans under a two-term cost model regroup each window's micro-batches
(``planner/two_term_regroup.py``) and decide their refinement per window, which changes their
packs: a version 7 state or older whose config names a two-term cost model is refused (its
position cannot be replayed exactly); every other state of versions 5-7 reads as before (text
plans are unchanged). 7: the tokens contract (``planner/token_contract.py``): the config's ``contract`` may be
``tokens``, whose ``packs_consumed`` counts micro-batches of at most ``max_tokens`` tokens; a
release before it cannot replay such a position, so it must refuse the state (it does: it
reads versions up to 6). Versions 5 and 6 hold no tokens contract and read as before (their
packs are unchanged). 6: canonical ranks (``epoch/canonical.py``): the config may hold ``canonical_ranks`` and
``canonical_ranks_per_node``, and a canonical cursor says where it stands in optimizer steps
(``canonical_steps``, ``step_micro_batches``), so it resumes on any size dividing V; a version
5 state (no canonical ranks) reads as before. 5: planner v4 (scope ``world`` plans rows of several nodes where nodes hold few
data-parallel ranks), which changes the packs of those configs; the config gains
``world_row``. 4: planner v3 (the heavy lane, shards cut by the read budget, scope ``world``
planned per node), which changes every epoch's packs: the config gains ``lane`` and
``max_amplification``;
and the config may hold ``tokens`` (where token ids come from: a token column of another name,
raw integer bytes, or a text column and its tokenizer) and ``max_seq_len`` (where it cuts a
record, which the plan then costs as truncated; a state without it means none). 3 added ``mixture`` (the streams a
mixture plan reads; absent for one dataset). Versions 1-4 are refused with what to do: their
position cannot be replayed exactly."""
READABLE = (5, 6, 7, 8, 9, STATE_VERSION)
KEY_MIXTURE = "mixture"
MIXTURE_CHANGES = ("refuse", "restart_epoch")
"""What a resume does when the checkpoint's mixture differs from the loader's."""
KEY_VERSION = "version"
KEY_EPOCH = "epoch"
KEY_CONSUMED = "packs_consumed"
KEY_FINGERPRINT = "fingerprint"
KEY_CONFIG = "config"
KEY_SEGMENTS = "segments"
KEY_STEPS = "canonical_steps"
KEY_MICRO = "step_micro_batches"
RESIZABLE = ("world_size", "ranks_per_node")
BOOL_FIELDS = frozenset(f.name for f in fields(PlanConfig) if f.type == "bool")
"""Planner fields that are flags (any other bool in a state's config is corruption)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where every rank stands: ``packs_consumed`` packs of ``epoch`` (per rank)."""

    epoch: int
    packs_consumed: int
    fingerprint: str
    config: ReaderConfig
    segments: tuple[Segment, ...] = ()
    """Earlier world sizes of this epoch (elastic resume), oldest first."""
    mixture: tuple[dict[str, Any], ...] | None = None
    """A mixture's streams (``MixtureIndex.describe()``: paths, weights, fingerprints)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-friendly state a loader's ``state_dict()`` returns."""
        out = {
            KEY_VERSION: STATE_VERSION,
            KEY_EPOCH: self.epoch,
            KEY_CONSUMED: self.packs_consumed,
            KEY_FINGERPRINT: self.fingerprint,
            KEY_CONFIG: self.config.to_dict(),
            KEY_SEGMENTS: [s.to_dict() for s in self.segments],
        }
        if self.mixture is not None:
            out[KEY_MIXTURE] = [dict(s) for s in self.mixture]
        if self.config.canonical_ranks is not None:
            out[KEY_STEPS], out[KEY_MICRO] = self.step_position
        return out

    @property
    def step_position(self) -> tuple[int, int]:
        """(optimizer steps done, micro-batches done of the next step) of a canonical cursor:
        steps are the same at every physical size, micro-batches are this size's."""
        return divmod(self.packs_consumed, self.config.micro_batches_per_step)


def _need(state: dict[str, Any], key: str, kind: type) -> Any:
    if key not in state:
        raise StateError(f"reader state has no {key!r} (keys: {sorted(state)}); not a bcl state")
    value = state[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise StateError(
            f"reader state {key!r} must be {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _count(value: Any, name: str, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``, else a StateError."""
    if type(value) is not int or not low <= value <= high:
        raise StateError(
            f"reader state {name} must be an integer in [{low}, {high}], got {value!r}; "
            "the checkpoint is corrupt or was not written by bcl-stream"
        )
    return value


def _segment(raw: Any, i: int) -> Segment:
    fields = ("world_size", "ranks_per_node", "packs_consumed")
    if not isinstance(raw, dict) or sorted(raw) != sorted(fields):
        raise StateError(
            f"reader state has an invalid config or segment list: segment {i} must be a dict "
            f"with keys {fields}, got {raw!r}"
        )
    return Segment(
        _count(raw["world_size"], f"segments[{i}].world_size", 1, MAX_RANKS),
        _count(raw["ranks_per_node"], f"segments[{i}].ranks_per_node", 1, MAX_RANKS),
        _count(raw["packs_consumed"], f"segments[{i}].packs_consumed", 0, MAX_COUNT),
    )


_REPLAY_FIX = (
    "Resume it with the bcl-stream release that wrote it, or drop the data loader's state "
    "from the checkpoint (model and optimizer states stay valid) to start the epoch over"
)
_RETIRED = {
    1: "was written by planner v1, whose epoch order differs from this release's: its "
    "position cannot be replayed exactly",
    2: "was written before the stratified shuffle was aligned with windows across shard "
    "groups; this release orders the epoch differently, so its position cannot be replayed "
    "exactly",
    3: "was written by planner v2; planner v3 (the heavy lane and the read budget) orders "
    "every epoch differently, so its position cannot be replayed exactly",
    4: "was written by planner v3; planner v4 plans scope world in rows of several nodes "
    "where nodes hold few data-parallel ranks, so its position cannot be replayed exactly",
}
"""State versions of earlier planners, each with why its position cannot be replayed."""


def parse_state(state: Any) -> Cursor:
    """A saved state as a :class:`Cursor`, checking its structure (not yet its fit)."""
    if not isinstance(state, dict):
        raise StateError(f"reader state must be a dict, got {type(state).__name__}")
    version = _readable_version(state)
    mixture = state.get(KEY_MIXTURE)
    if mixture is not None and (
        not isinstance(mixture, list) or not all(isinstance(m, dict) for m in mixture)
    ):
        raise StateError(f"reader state {KEY_MIXTURE!r} must be a list of dicts, got {mixture!r}")
    epoch = _need(state, KEY_EPOCH, int)
    consumed = _need(state, KEY_CONSUMED, int)
    if epoch < 0 or consumed < 0:
        raise StateError(f"reader state has negative epoch={epoch} or packs_consumed={consumed}")
    _count(epoch, KEY_EPOCH, 0, MAX_COUNT)
    _count(consumed, KEY_CONSUMED, 0, MAX_COUNT)
    raw_config = _need(state, KEY_CONFIG, dict)
    _check_config_numbers(raw_config)
    segments = tuple(_segment(s, i) for i, s in enumerate(_need(state, KEY_SEGMENTS, list)))
    try:
        config = ReaderConfig.from_dict(raw_config)
    except (TypeError, ValueError) as exc:
        raise StateError(f"reader state has an invalid config or segment list: {exc}") from exc
    cursor = Cursor(
        epoch,
        consumed,
        _need(state, KEY_FINGERPRINT, str),
        config,
        segments,
        None if mixture is None else tuple(mixture),
    )
    _check_steps(state, cursor, version)
    if version < 7 and cursor.config.plan.contract == "tokens":
        raise StateError(
            f"reader state version {version} says contract='tokens', which only version 7 "
            "states hold: it was edited or written by another release; drop the data loader's "
            "state from the checkpoint to start the epoch over"
        )
    if version < STATE_VERSION and _two_term(cursor.config.cost_model):
        raise StateError(
            f"reader state version {version} was written under the two-term cost model "
            f"{cursor.config.cost_model!r} by an earlier planner, which refined image-text plans "
            "another way; this release plans them differently, so its position cannot be "
            f"replayed exactly. {_REPLAY_FIX}"
        )
    return cursor


def _two_term(cost_model: str | None) -> bool:
    """Whether a state's cost model is a two-term one (a bad two-term file is refused)."""
    try:
        return resolve_two_term(cost_model) is not None
    except ValueError as exc:
        raise StateError(f"reader state names a cost model that cannot be read: {exc}") from exc


def _readable_version(state: dict[str, Any]) -> int:
    """The state's version, or a refusal: an earlier planner's (saying why its position
    cannot be replayed, and what to do) or one this release does not know."""
    version = _need(state, KEY_VERSION, int)
    if version in _RETIRED:
        raise StateError(f"reader state version {version} {_RETIRED[version]}. {_REPLAY_FIX}")
    if version not in READABLE:
        raise StateError(
            f"reader state version {version} is not supported (this reader writes "
            f"{STATE_VERSION}); resume with the bcl-stream release that wrote it"
        )
    return version


def _check_config_numbers(raw_config: dict[str, Any]) -> None:
    """The saved config's world size and ranks per node in range, and no bool where a
    number belongs (``from_dict`` would take True for 1), before it is built."""
    raw_plan = raw_config.get("plan")
    view = {**raw_config, **raw_plan} if isinstance(raw_plan, dict) else raw_config
    for name in RESIZABLE:
        if name in view:
            _count(view[name], f"config.{name}", 1, MAX_RANKS)
    flags = [k for k, v in view.items() if isinstance(v, bool) and k not in BOOL_FIELDS]
    if flags:
        raise StateError(f"reader state config {flags[0]!r} is a bool, expected a number")


def _check_steps(state: dict[str, Any], cursor: Cursor, version: int) -> None:
    """A canonical cursor's step position must be there and agree with ``packs_consumed``
    (a state edited by hand, or written by another release, is refused)."""
    if cursor.config.canonical_ranks is None:
        extra = [k for k in (KEY_STEPS, KEY_MICRO) if k in state]
        if extra:
            raise StateError(f"reader state has {extra} but its config has no canonical_ranks")
        return
    if version < 6:
        raise StateError(f"reader state version {version} cannot hold canonical_ranks")
    if cursor.segments:
        raise StateError("reader state with canonical_ranks cannot hold elastic segments")
    steps = _count(_need(state, KEY_STEPS, int), KEY_STEPS, 0, MAX_COUNT)
    micro = _count(_need(state, KEY_MICRO, int), KEY_MICRO, 0, MAX_COUNT)
    if (steps, micro) != cursor.step_position:
        raise StateError(
            f"reader state says {KEY_STEPS}={steps}, {KEY_MICRO}={micro} but packs_consumed="
            f"{cursor.packs_consumed} with {cursor.config.micro_batches_per_step} micro-batches "
            "per step means "
            f"{cursor.step_position}; the checkpoint is corrupt or was not written by bcl-stream"
        )


def resolve_state(
    state: Any,
    *,
    fingerprint: str,
    config: ReaderConfig,
    allow_resize: bool = True,
    mixture: list[dict[str, Any]] | None = None,
    on_mixture_change: str = "refuse",
) -> Cursor:
    """The cursor to resume from under ``config`` on data with ``fingerprint`` (a mixture's:
    ``mixture``, its streams described).

    Output: a cursor whose ``config`` is ``config``, with the saved canonical node size
    where ``config`` leaves it unpinned (:func:`adopt_canonical_layout`). Same world size:
    the saved cursor. A different world size: the saved plan appended to ``segments`` and
    ``packs_consumed=0``.
    A changed mixture: refused, naming every change, unless ``on_mixture_change`` is
    ``restart_epoch`` (then the saved epoch starts over, from pack 0, on the new mixture).
    Raises StateError naming the first mismatch.
    """
    if on_mixture_change not in MIXTURE_CHANGES:
        raise ValueError(f"on_mixture_change must be one of {MIXTURE_CHANGES}")
    saved = parse_state(state)
    config = adopt_canonical_layout(saved.config, config)
    current = None if mixture is None else tuple(mixture)
    if saved.mixture is not None or current is not None:
        changes = _mixture_changes(saved.mixture, current)
        if changes and on_mixture_change == "restart_epoch":
            _check_config(saved.config, config)
            return Cursor(saved.epoch, 0, fingerprint, config, (), current)
        if changes:
            raise StateError(
                f"reader state was saved on another mixture ({'; '.join(changes)}). Resume "
                "with the original streams and weights, or start the epoch over with the new "
                f"mixture (on_mixture_change='restart_epoch'; epoch {saved.epoch} is then read "
                "again from its first pack)."
            )
    if saved.fingerprint != fingerprint:
        raise StateError(
            f"reader state was saved on other data (fingerprint {saved.fingerprint}, this "
            f"dataset {fingerprint}): the shards or the cost index changed. Resume on the "
            "original dataset, or start a fresh run without the loader state."
        )
    _check_config(saved.config, config)
    old, new = saved.config.flat(), config.flat()
    if all(old[n] == new[n] for n in RESIZABLE):
        return Cursor(
            saved.epoch, saved.packs_consumed, fingerprint, config, saved.segments, current
        )
    if not allow_resize:
        moved = ", ".join(f"{n} {old[n]} -> {new[n]}" for n in RESIZABLE if old[n] != new[n])
        raise StateError(
            f"reader state was saved with another world size ({moved}) and elastic resume is "
            "disabled for this reader; resume with the original world size."
        )
    if saved.config.canonical_ranks is not None:
        return _canonical_resume(saved, config, current)
    old_plan = saved.config.plan
    segment = Segment(old_plan.world_size, old_plan.ranks_per_node, saved.packs_consumed)
    return Cursor(saved.epoch, 0, fingerprint, config, (*saved.segments, segment), current)


def adopt_canonical_layout(saved: ReaderConfig, config: ReaderConfig) -> ReaderConfig:
    """``config`` with the saved ``canonical_ranks_per_node`` where it leaves it unpinned.

    Why: the canonical layout is part of the plan being replayed, not of the machines that
    run it (Mosaic Streaming likewise takes ``num_canonical_nodes`` from the checkpoint). A
    fresh run takes the physical ranks per node, so without this a job resumed on nodes of
    another size would replan under another canonical layout, and be refused. An explicit
    value that differs from the saved one is refused, naming both."""
    kept, given = saved.canonical_ranks_per_node, config.canonical_ranks_per_node
    if saved.canonical_ranks is None or config.canonical_ranks != saved.canonical_ranks:
        return config  # no canonical layout to adopt; _check_config names a changed V
    if given is None:
        return replace(config, canonical_ranks_per_node=kept)
    if given != kept:
        raise StateError(
            f"reader state was saved with canonical_ranks_per_node={kept} but the loader sets "
            f"canonical_ranks_per_node={given}; the replayed plan would differ. Leave "
            f"canonical_ranks_per_node unset (the saved {kept} is adopted) or set it to "
            f"{kept} to resume, or start a fresh run without the loader state."
        )
    return config


def _canonical_resume(
    saved: Cursor, config: ReaderConfig, mixture: tuple[dict[str, Any], ...] | None
) -> Cursor:
    """A canonical cursor on another physical size: the same optimizer step, counted in this
    size's micro-batches. Inside a step it is refused: its first micro-batches were groups of
    the old size's, which the new size cannot continue (nor could the trainer's accumulated
    gradient, which a checkpoint does not hold)."""
    steps, micro = saved.step_position
    if micro:
        old = saved.config.plan
        raise StateError(
            f"reader state was saved inside optimizer step {steps} ({micro} of its "
            f"{saved.config.micro_batches_per_step} micro-batches on {old.world_size} ranks); "
            "with canonical_ranks a resume on another data-parallel size starts at a step "
            f"boundary. Resume on {old.world_size} ranks, or from a checkpoint saved after an "
            "optimizer step (Lightning's ModelCheckpoint(every_n_train_steps=...) saves there)"
        )
    consumed = steps * config.micro_batches_per_step
    return Cursor(saved.epoch, consumed, saved.fingerprint, config, (), mixture)


def _check_config(saved: ReaderConfig, config: ReaderConfig) -> None:
    """Every field but the resizable ones must match: the replayed plan depends on them."""
    old, new = saved.flat(), config.flat()
    for name in old:
        if name not in RESIZABLE and old[name] != new[name]:
            raise StateError(
                f"reader state was saved with {name}={old[name]!r} but the loader has "
                f"{name}={new[name]!r}; the replayed plan would differ. Use {name}={old[name]!r} "
                "to resume, or start a fresh run without the loader state."
            )


def _mixture_changes(
    saved: tuple[dict[str, Any], ...] | None, current: tuple[dict[str, Any], ...] | None
) -> list[str]:
    if saved is None:
        return ["the state was saved on one dataset, the loader reads a mixture"]
    if current is None:
        return ["the state was saved on a mixture, the loader reads one dataset"]
    return mixture_changes(list(saved), list(current))
