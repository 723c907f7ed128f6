"""The planner: pure functions from (costs, shard table, configuration, seed, epoch) to packs.

No I/O and no torch here (tests/unit/test_purity.py guards it): every rank runs this on the
replicated cost index and must get the same answer, fast.
"""

from bcl_stream.planner.baselines import global_order, pooled_mffd_split
from bcl_stream.planner.bcl import build_node_streams, iter_windows, plan_epoch, plan_streams
from bcl_stream.planner.config import SCOPES, Plan, PlanConfig
from bcl_stream.planner.shard_table import KeepFilter, ShardTable, shard_weights
from bcl_stream.planner.windows import WindowBatch, plan_windows

__all__ = [
    "SCOPES",
    "KeepFilter",
    "Plan",
    "PlanConfig",
    "ShardTable",
    "WindowBatch",
    "build_node_streams",
    "global_order",
    "iter_windows",
    "plan_epoch",
    "plan_streams",
    "plan_windows",
    "pooled_mffd_split",
    "shard_weights",
]
