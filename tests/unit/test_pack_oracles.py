"""The "every record once" oracle finds each way an epoch can go wrong, and names the ids."""

from __future__ import annotations

import re

import numpy as np
import pytest
from pack_oracles import account, check_every_record_once, flat_ids


def test_nested_packs_arrays_and_remainders_flatten_in_order() -> None:
    nested = [[[0, 1], np.array([2, 3])], {"too_long": [4], "tail": np.array([[5]])}]
    assert flat_ids(nested) == [0, 1, 2, 3, 4, 5]
    assert flat_ids(["a", ("b", 7)]) == ["a", "b", 7]


def test_a_complete_epoch_passes_with_its_remainder() -> None:
    check_every_record_once([[[0, 2], [4, 1]]], 6, left_out={"tail": [3, 5]})
    check_every_record_once([[9, 7]], {7, 9})
    check_every_record_once([[9, 7], [3]])  # no expected set: repeats only


@pytest.mark.parametrize(
    ("yielded", "left_out", "found"),
    [
        ([[0, 1], [2]], [], "missing 1: [3]"),
        ([[0, 1], [1, 2]], [3], "duplicated 1: [1]"),
        ([[0, 1], [2]], [2, 3], "duplicated 1: [2]"),  # yielded and reported
        ([[0, 1], [2, 3]], [7], "unexpected 1: [7]"),
    ],
)
def test_each_fault_is_named(yielded: list[list[int]], left_out: list[int], found: str) -> None:
    with pytest.raises(AssertionError, match=rf"epoch 0: .*{re.escape(found)}"):
        check_every_record_once(yielded, 4, left_out, what="epoch 0")


def test_repeats_are_found_without_an_expected_set() -> None:
    assert account([[5, 6], [6]]).duplicated == {6: 2}
    with pytest.raises(AssertionError, match=r"duplicated 1: \[6\]"):
        check_every_record_once([[5, 6], [6]])
