"""Hypothesis strategies for the planner's property tests: the layout of a plan drawn as one
value instead of four loose integers in every test header.

A plan is ``ranks`` ranks, each running micro-batches of ``size`` records, ``group``
micro-batches per optimizer step (accumulation, or packs per window) and ``steps`` steps (or
windows). The property tests of the planner, the heavy lane, the pooled peers and the
two-term refinement all draw this same bundle, each within its own bounds; drawing it here
keeps the meaning of each dimension (and of :attr:`Grid.records`) in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

SEEDS = st.integers(0, 2**16)
"""A numpy seed: the record lengths or costs of one example are drawn from it."""


@dataclass(frozen=True)
class Grid:
    """The layout of one drawn plan (see the module docstring)."""

    ranks: int
    size: int
    group: int
    steps: int

    @property
    def records(self) -> int:
        """Records a full plan of this layout holds: one per slot, none left over."""
        return self.ranks * self.size * self.group * self.steps


def grids(
    ranks: tuple[int, int] = (1, 4),
    size: tuple[int, int] = (1, 6),
    group: tuple[int, int] = (1, 4),
    steps: tuple[int, int] = (1, 3),
) -> st.SearchStrategy[Grid]:
    """Layouts with each dimension within its inclusive ``(low, high)`` bounds; ``(1, 1)``
    pins a dimension a test does not use."""
    return st.builds(
        Grid,
        ranks=st.integers(*ranks),
        size=st.integers(*size),
        group=st.integers(*group),
        steps=st.integers(*steps),
    )
