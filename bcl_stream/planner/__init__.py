"""The planner: pure functions from (costs, shard table, configuration, seed, epoch) to packs.

No I/O and no torch here (tests/unit/test_purity.py guards it): every rank runs this on the
replicated cost index and must get the same answer, fast. Only BCL's own planning lives here;
the systems it is measured against are reproduced in ``bcl_stream.peers``, which may import
the planner but is never imported by it.
"""

from bcl_stream.planner.bcl import (
    build_node_streams,
    build_token_streams,
    iter_windows,
    plan_epoch,
    plan_streams,
)
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
    "build_token_streams",
    "iter_windows",
    "plan_epoch",
    "plan_streams",
    "plan_windows",
    "shard_weights",
]
