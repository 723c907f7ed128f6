"""The contracts, one object each: what the trainer is promised about its micro-batches.

Every contract keeps the promises all of them share (docs/balance.md): every rank yields the
same number of micro-batches per optimizer step and per epoch, computed from the replicated
index alone, and every record is yielded once per epoch or reported. What differs is what a
micro-batch holds, and so which parts of the reader and the trainer follow it; the places that
used to test ``contract == "step"`` ask the contract's :class:`Contract` instead.

What a new contract touches: its planning module, its entry here, and its tests. Readers walk
any plan through one interface (``epoch/schedule.py``; ``formats/reader_base.py`` has one walk),
the configuration, the cursor, canonical ranks and the DataModule read the flags below. Only a
contract that plans its own micro-batches with a walker of its own (as ``tokens`` does) adds
where that walker is picked, by its flags: ``ReaderPlan`` (``epoch/plan.py``) for readers,
``plan_epoch`` and ``build_token_streams`` (``planner/bcl.py``) for whole epochs, which the
simulator plans through too.

- ``pack`` (default, the paper's): exactly B records per micro-batch (``planner/windows.py``).
- ``step``: exactly G*B records per rank and optimizer step, re-cut into G micro-batches of
  varying size (``planner/step_contract.py``).
- ``tokens``: at most ``max_tokens`` T tokens per micro-batch, records vary, G micro-batches
  per step (``planner/token_contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Contract:
    """One contract's promises and the behaviour the readers and the trainer take from it.
    The defaults are the plainest contract's (nothing re-cut or budgeted, canonical ranks and
    both layouts supported): an entry names only where it differs."""

    name: str
    summary: str
    """One line: what a micro-batch holds."""
    module: str
    """The planner module that implements it."""
    fixed_records: bool = False
    """Every micro-batch holds exactly B records (the record-count contract)."""
    recut_steps: bool = False
    """A step's records are re-cut across its micro-batches and the ranks of its row after
    planning (readers re-cut; a state saved inside a step resumes on the same world size only)."""
    step_records: bool = False
    """Every optimizer step holds exactly G*B records per rank: a micro-batch's record-mean loss
    is scaled by its records / B (``loss_scale``) to weigh every record of the step alike."""
    budget: bool = False
    """Micro-batches are cut to the token budget ``max_tokens`` (required)."""
    canonical: bool = True
    """Canonical ranks (the same optimizer steps at every world size dividing V) supported."""
    layouts: tuple[str, ...] = ("packed", "padded")
    """The layouts (``PlanConfig.layout``) it plans."""


REGISTRY: dict[str, Contract] = {
    c.name: c
    for c in (
        Contract(
            name="pack",
            summary="exactly B records per micro-batch",
            module="bcl_stream.planner.windows",
            fixed_records=True,
        ),
        Contract(
            name="step",
            summary="exactly G*B records per rank and optimizer step, micro-batches vary",
            module="bcl_stream.planner.step_contract",
            recut_steps=True,
            step_records=True,
            canonical=False,
        ),
        Contract(
            name="tokens",
            summary="at most max_tokens tokens per micro-batch, G micro-batches per step",
            module="bcl_stream.planner.token_contract",
            budget=True,
        ),
    )
}
"""Every contract by name (``PlanConfig.contract``)."""

CONTRACTS = tuple(REGISTRY)
"""The contracts' names, in the order docs and options list them."""


def contract(name: str) -> Contract:
    """The contract named ``name`` (a ValueError lists the known ones)."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"contract must be one of {CONTRACTS}, got {name!r}") from exc
