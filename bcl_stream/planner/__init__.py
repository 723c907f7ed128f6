"""The planner: pure functions from (costs, stream order, configuration) to packs.

No I/O and no torch here (tests/unit/test_purity.py guards it): every rank runs this on the
replicated cost index and must get the same answer, fast.
"""

from bcl_stream.planner.baselines import pooled_mffd_split, sequential
from bcl_stream.planner.bcl import SCOPES, Plan, PlanConfig, plan_epoch
from bcl_stream.planner.order import epoch_order

__all__ = [
    "SCOPES",
    "Plan",
    "PlanConfig",
    "epoch_order",
    "plan_epoch",
    "pooled_mffd_split",
    "sequential",
]
