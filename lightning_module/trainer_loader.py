"""The training loader as Lightning counts it, and the one warning of Lightning's that does not
apply to our loaders.

Both the training loader (:class:`TrainerPackLoader`) and the evaluation loaders
(``lightning_module.evaluation``) have an exact ``len()``, so they share
:func:`explain_len_warning`; the training loader's ``len()`` also follows Lightning's batch
counter across an elastic resume.
"""

from __future__ import annotations

import warnings
from typing import Any

from bcl_stream import PackLoader


class TrainerPackLoader(PackLoader):
    """``PackLoader`` whose ``len()`` counts the epoch the way Lightning's fit loop does.

    After an elastic resume (checkpoint from another world size) the reader re-plans the rest
    of the epoch: its cursor restarts at pack 0 of the new plan, while Lightning restores its
    own batch counter (k batches done) and ends the epoch when that counter reaches ``len()``.
    With the plain plan length Lightning would stop k packs early and the next epoch would
    start inside this one. Here ``len()`` = packs consumed under earlier world sizes + packs
    of the new plan, so both counters agree; iteration and the saved cursor are unchanged.
    """

    progress_shift = 0
    """Under ``canonical_ranks``, after a resume on another size: micro-batches to add to
    Lightning's restored batch counter (``lightning_module/canonical.py``); 0 once applied."""

    def __len__(self) -> int:
        return sum(s.packs_consumed for s in self._segments) + self.plan_len()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.plan_dataset.config.canonical_ranks is not None and not self._shifted:
            saved = state.get("packs_consumed")
            self.progress_shift = self._consumed - saved if isinstance(saved, int) else 0

    _shifted = False


LEN_WARNING = r"Your `IterableDataset` has `__len__` defined"


def explain_len_warning() -> None:
    """Silence Lightning's "IterableDataset has __len__" warning, which does not apply here.

    Lightning warns because a ``__len__`` can be wrong when DataLoader workers each yield the
    whole dataset. Ours is exact by construction: worker w of K yields packs w, w+K, ... of
    this rank's plan, and ``len()`` is the plan's pack count (tests check it for 0, 1 and 2
    workers). The filter matches that one message only.
    """
    warnings.filterwarnings("ignore", message=LEN_WARNING)
