"""The resume harness fails where a resume goes wrong: a loader that loses a pack, repeats
one, restarts its epoch or moves an epoch boundary, and a trainer log that differs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from resume_harness import check_resumed_log, check_resumed_runs, run_test_save_load_state

EPOCH = [[0, 1], [2, 3], [4, 5], [6, 7]]


class ListLoader:
    """Packs of records ``{"sample_id": i}``: epoch e yields ``EPOCH`` shifted by 10 * e; the
    state is (epoch, packs consumed). ``fault`` plants one way of resuming wrongly."""

    def __init__(self, fault: str = "") -> None:
        self.epoch, self.consumed, self.fault = 0, 0, fault

    def __iter__(self) -> Iterator[list[dict[str, int]]]:
        if self.consumed == len(EPOCH):  # saved after the epoch's last pack: the next epoch
            self.epoch, self.consumed = self.epoch + 1, 0
        epoch, start = self.epoch, self.consumed
        for t in range(start, len(EPOCH)):
            self.consumed = t + 1
            yield [{"sample_id": i + 10 * epoch} for i in EPOCH[t]]
        self.epoch, self.consumed = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.consumed = state["epoch"], state["consumed"]
        if self.fault == "skip":
            self.consumed += 1
        elif self.fault == "repeat":
            self.consumed = max(self.consumed - 1, 0)
        elif self.fault == "restart":
            self.consumed = 0
        elif self.fault == "end_is_new_epoch" and self.consumed == len(EPOCH):
            self.epoch += 2  # the saved epoch end lands one epoch too far
            self.consumed = 0


def test_a_correct_loader_passes_at_every_position() -> None:
    run_test_save_load_state(ListLoader)


@pytest.mark.parametrize("fault", ["skip", "repeat", "restart", "end_is_new_epoch"])
def test_each_planted_fault_is_found(fault: str) -> None:
    def make() -> ListLoader:
        return ListLoader(fault)

    with pytest.raises(AssertionError, match=r"differs from the uninterrupted run|epoch"):
        run_test_save_load_state(make, make_resumed=make, reference=[EPOCH_KEYS, NEXT_KEYS])


EPOCH_KEYS = [tuple(p) for p in EPOCH]
NEXT_KEYS = [tuple(i + 10 for i in p) for p in EPOCH]


def test_a_reference_plan_is_compared_instead_of_a_run() -> None:
    run_test_save_load_state(ListLoader, epochs=1, positions=[1, 3], reference=[EPOCH_KEYS])
    with pytest.raises(AssertionError, match=r"resume after 1 packs differs .* at entry 1"):
        wrong = [EPOCH_KEYS[0], (9, 9), *EPOCH_KEYS[2:]]
        run_test_save_load_state(ListLoader, epochs=1, positions=[1], reference=[wrong])


def test_trainer_logs_are_compared_from_the_step_of_the_save() -> None:
    full = [(s, s // 4, [s]) for s in range(8)]
    check_resumed_runs(full, lambda k: full[k:], [1, 4, 8])
    check_resumed_log(full, 3, full[3:])
    with pytest.raises(AssertionError, match=r"resume after 3 steps differs .* at entry 0"):
        check_resumed_log(full, 3, full[2:])
    with pytest.raises(AssertionError, match="no save after step 0"):
        check_resumed_runs(full, lambda k: full[k:], [0])
