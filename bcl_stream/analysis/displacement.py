"""How far a plan moves records from their stream position, in steps.

A record's stream position is where a plain reader of its node's stream would meet it: window
k of the node stream (its k-th run of W*P*B records) is emitted in steps [k*W, (k+1)*W). BCL
reorders records inside a window by construction, so a record emitted anywhere in its own
window's steps has displacement 0; one emitted outside them is displaced by the distance in
steps to its window (the heavy lane pulls a block's heaviest records up to ``lane - 1`` windows
forward; the carry holds records back one window). ``simulate --json`` reports the mean over
every emitted record and the maximum as ``displacement_steps_mean`` / ``displacement_steps_max``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bcl_stream.planner.node_streams import NodeStreams


def stream_windows(streams: NodeStreams) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(ids, window) of every record the epoch emits: the node-stream window each sits in
    before any reordering (the lane's own order is not applied). O(records): a tool."""
    c = streams.config
    used = streams.n_packs * c.stream_ranks * c.pack_size
    positions = np.arange(used, dtype=np.int64)
    ids = [node.take(positions) for node in streams.nodes]
    windows = np.tile(positions // c.node_window_records, len(streams.nodes))
    return np.concatenate(ids or [np.empty(0, np.int64)]), windows


def displacement_steps(packs: npt.NDArray[np.int64], streams: NodeStreams) -> tuple[float, int]:
    """(mean, max) displacement in steps of the records of ``packs`` ((ranks, n_packs, B), the
    plan made from ``streams``); see the module docstring."""
    window = streams.config.window
    ids, home = stream_windows(streams)
    if ids.size == 0:
        return 0.0, 0
    where = np.full(streams.n_records, -1, dtype=np.int64)
    where[ids] = home
    step = np.broadcast_to(np.arange(packs.shape[1])[None, :, None], packs.shape)
    k = where[packs.reshape(-1)]
    if np.any(k < 0):
        raise ValueError("packs hold records the streams do not emit: not this plan's streams")
    t = step.reshape(-1)
    early = np.maximum(k * window - t, 0)
    late = np.maximum(t - ((k + 1) * window - 1), 0)
    moved = early + late
    return float(moved.mean()), int(moved.max())
