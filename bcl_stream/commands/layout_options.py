"""The job's shape on the command line: ``--world-size``, ``--nodes``, ``--ranks-per-node``.

``plan``, ``read``, ``simulate`` and ``inspect`` all need to know how the data-parallel ranks
sit on nodes: a node reads only its own shards, so ranks per node changes every plan. The three
options and the rule that turns them into (nodes, ranks per node) live here so that the
commands cannot read the same flags as different jobs.

The rule follows torchrun's habit (``--nnodes`` x ``--nproc-per-node``): ``--world-size R``
alone is one node of R ranks; ``--nodes N`` makes it N nodes of R/N ranks;
``--ranks-per-node P`` makes it R/P nodes of P ranks. Given together, ``--nodes`` and
``--ranks-per-node`` must multiply to the world size (and then ``--world-size`` may be left
out). Before this module, ``--world-size R`` alone meant R nodes of one rank each, which a
person running one 8-GPU node never meant: the packs it printed for rank 0 were not the
packs rank 0 of that node trains.

Every summary states the layout it assumed (:meth:`ProcessLayout.text`), in the text and in
``--json`` (:meth:`ProcessLayout.to_json`).
"""

from __future__ import annotations

import argparse
from typing import Any

from bcl_stream.commands.config_options import add_plan_config_options
from bcl_stream.process_layout import ProcessLayout

LAYOUT_FIELDS = frozenset({"world_size", "ranks_per_node"})
"""The PlanConfig fields these options own (``add_plan_config_options(skip=LAYOUT_FIELDS)``)."""


def add_layout_options(
    p: argparse.ArgumentParser,
    *,
    world_aliases: tuple[str, ...] = (),
    world_help: str = "data-parallel ranks in all (R)",
) -> None:
    """``--world-size`` (plus ``world_aliases``), ``--nodes`` and ``--ranks-per-node``, all
    None when not given: :func:`resolve_layout` applies the defaults, because which one
    stands in for a missing option depends on the others (argparse's "required" or a fixed
    default for ``--world-size`` would refuse ``--nodes 4 --ranks-per-node 8``)."""
    group = p.add_argument_group("ranks and nodes (torchrun's --nnodes x --nproc-per-node)")
    group.add_argument(
        "--world-size",
        *world_aliases,
        dest="layout_world_size",
        type=int,
        default=None,
        metavar="R",
        help=f"{world_help}; alone it means ONE node of R ranks (not R nodes of one rank: "
        "add --nodes R or --ranks-per-node 1 for that)",
    )
    group.add_argument(
        "--nodes",
        dest="layout_nodes",
        type=int,
        default=None,
        metavar="N",
        help="nodes; ranks per node = R / N (default: 1 node, or R / --ranks-per-node)",
    )
    group.add_argument(
        "--ranks-per-node",
        dest="layout_ranks_per_node",
        type=int,
        default=None,
        metavar="P",
        help="data-parallel ranks per node (default: R / --nodes); with --nodes, N x P must "
        "be R. A node reads only its own shards",
    )


def add_planner_options(
    p: argparse.ArgumentParser,
    *,
    skip: frozenset[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
    world_aliases: tuple[str, ...] = (),
    world_help: str = "data-parallel ranks in all (R)",
) -> None:
    """The layout options, then one option per other PlanConfig field (except ``skip``;
    ``defaults``: a command's own scenario defaults): what ``plan``, ``read`` and
    ``simulate`` take, assembled in one place so none takes the layout fields twice."""
    add_layout_options(p, world_aliases=world_aliases, world_help=world_help)
    add_plan_config_options(p, skip=LAYOUT_FIELDS | skip, defaults=defaults)


def resolve_layout(
    args: argparse.Namespace,
    *,
    world_option: str = "--world-size",
    default_world: int | None = None,
) -> ProcessLayout:
    """The layout the options describe, or a ValueError (one line: the values seen and what
    to give instead). ``world_option`` is how the message spells the world size;
    ``default_world`` is the world size when neither it nor ``--nodes`` with
    ``--ranks-per-node`` is given (None: the world size is required)."""
    world, nodes, per_node = (
        args.layout_world_size,
        args.layout_nodes,
        args.layout_ranks_per_node,
    )
    for name, value in ((world_option, world), ("--nodes", nodes), ("--ranks-per-node", per_node)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if world is None and (nodes is None or per_node is None):
        world = default_world
    if world is None:
        if nodes is None or per_node is None:
            raise ValueError(
                f"give {world_option} R (data-parallel ranks in all; one node unless --nodes "
                "says otherwise), or --nodes N with --ranks-per-node P"
            )
        return ProcessLayout(world_size=nodes * per_node, ranks_per_node=per_node)
    if nodes is not None and per_node is not None:
        if nodes * per_node != world:
            raise ValueError(
                f"--nodes {nodes} x --ranks-per-node {per_node} = {nodes * per_node} ranks, "
                f"but {world_option} is {world}: give two of the three, or make them agree"
            )
        return ProcessLayout(world_size=world, ranks_per_node=per_node)
    if per_node is not None:
        if world % per_node:
            raise ValueError(
                f"--ranks-per-node {per_node} does not divide {world_option} {world}: every "
                "node runs the same number of ranks"
            )
        return ProcessLayout(world_size=world, ranks_per_node=per_node)
    nodes = 1 if nodes is None else nodes
    if world % nodes:
        raise ValueError(
            f"{world_option} {world} is not a multiple of --nodes {nodes}: every node runs the "
            "same number of ranks"
        )
    return ProcessLayout(world_size=world, ranks_per_node=world // nodes)
