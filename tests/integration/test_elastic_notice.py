"""An elastic resume (a checkpoint of 2 ranks resumed on 1) says what it did, once, and the
DataModule's info line shows the plan after the resume, not the pre-resume one (issue point 9).
"""

from __future__ import annotations

import logging
from itertools import islice
from pathlib import Path

import pytest
from pack_oracles import check_every_record_once

from lightning_module import BCLDataModule

pytestmark = pytest.mark.slow

PACK, WINDOW, TAKEN = 4, 4, 3


def module(data: Path) -> BCLDataModule:
    return BCLDataModule(str(data), plan={"pack_size": PACK, "window": WINDOW}, seed=2)


def test_elastic_resume_is_announced_with_the_new_plan(
    mds_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = module(mds_dir)
    two.setup_for(0, 2, 2)
    it = iter(two.train_dataloader())
    list(islice(it, TAKEN))
    state = two.state_dict()
    del it

    one = module(mds_dir)
    one.setup_for(0, 1, 1)
    one.load_state_dict(state)
    with caplog.at_level(logging.INFO):
        loader = one.train_dataloader()
        loader.load_state_dict(state["reader"])  # Lightning restores the loader too: no repeat
    notices = [r.getMessage() for r in caplog.records if "elastic resume" in r.getMessage()]
    assert len(notices) == 1, notices
    consumed = 2 * TAKEN * PACK
    assert f"saved on 2 ranks (2 per node) after {TAKEN} packs per rank of epoch 0" in notices[0]
    assert "this run has 1 ranks" in notices[0]
    assert f"The {consumed} records consumed before are skipped" in notices[0]
    assert notices[0].count("consumed_before_resize") == 1
    plan = loader.current_plan()
    on = "on 1 rank = 1 node x 1 rank per node"  # the nodes the plan assumed, said
    info = [r.getMessage() for r in caplog.records if on in r.getMessage()]
    assert len(info) == 1 and info[0].startswith("BCLDataModule:")
    assert f"{plan.n_packs} packs of {PACK} records per rank in epoch 0 {on}" in info[0]
    assert f"'consumed_before_resize': {consumed}" in info[0]  # the post-resume remainder
    ids = [int(s) for pack in loader for s in pack["sample_ids"]]
    check_every_record_once(ids)
    assert len(ids) == plan.n_packs * PACK
