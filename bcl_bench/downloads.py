"""Download benchmark: which shards each node really fetches from S3, per planning scope.

An ``s3://`` MDS dataset lives on a local moto server (127.0.0.1 only). Every simulated node
has its own cache directory and its own counting proxy in front of moto
(``bcl_bench.faulty_proxy``, which logs each request), so the
GET requests of each node are counted separately. Ranks are separate processes reading one
epoch through the real reader (``MDSPackDataset`` + ``PackLoader``), all at once, so the ranks
of a node share the node's cache through streaming's own shared-memory coordination.

Two nodes on one machine: streaming registers a node's shared memory under the first free
prefix in ``/dev/shm``, so two node leaders on one machine race for the same name. Where the
machine allows mount namespaces (``unshare -m``, root), each node gets its own ``/dev/shm``
(as on real separate machines), its own temp dir, and 2 ranks in a gloo process group over
the whole world. Otherwise each node has one rank, no process group, and the nodes build their
datasets one after the other (then read at the same time).

Per run (scope, cache_limit), reported:
- ``amplification``: sum over nodes of distinct shards fetched / distinct shards fetched;
- ``duplicate_gets``: GETs of a shard a node had already fetched in this epoch;
- ``unneeded_shards``: shards a node fetched although its ranks read no record of them;
- ``peak_cache_mb``: the most shard bytes in a node's cache dir (sampled every 10 ms, partial
  downloads included), against ``cache_limit`` when one is set. Streaming counts a shard in
  its cache usage only once its download completes, so concurrent downloads (ranks of a node,
  prefetch threads) can overshoot the limit by up to one shard each (``overshoot_shards``).

``tools/bench_downloads.py`` runs it and writes ``results/bench_downloads.json``; the ranks
are this module run as ``python -m bcl_bench.downloads RANK WORLD PER_NODE REMOTE DIST_PORT``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from bcl_bench.faulty_proxy import FaultyProxy
from bcl_bench.harness import ROOT
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.formats.read_options import ReadOptions
from bcl_stream.io.index import read_index

BUCKET = "bcl-bench-downloads"
PLAN_KNOBS = ("pack_size", "window", "scope", "shard_group", "seed")
"""The planner settings a ``build`` command carries, passed to the rank's reader by name."""
MARK = "@@"  # prefix of the protocol lines a rank prints (streaming may print other things)


# -- rank process ---------------------------------------------------------------------------
def rank_main(rank: int, world: int, per_node: int, remote: str, dist_port: int) -> None:
    """Build a reader per ``build`` command, read its epoch on ``go``; one JSON line each."""
    print(MARK + json.dumps({"kind": "alive", "rank": rank}), flush=True)  # namespace is up
    if dist_port:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{dist_port}", rank=rank, world_size=world
        )
    from bcl_stream.formats.mds_reader import MDSPackDataset
    from bcl_stream.loading.loader import PackLoader

    def say(kind: str, **data: Any) -> None:
        print(MARK + json.dumps({"kind": kind, "rank": rank, **data}), flush=True)

    say("started")
    dataset = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        if cmd["op"] == "build":
            knobs = {k: cmd[k] for k in PLAN_KNOBS}
            config = ReaderConfig.build(world_size=world, ranks_per_node=per_node, **knobs)
            options = ReadOptions(cache_limit=cmd["cache_limit"], prefetch=cmd["prefetch"])
            dataset = MDSPackDataset(
                remote, config, rank, cache_dir=cmd["cache_dir"], options=options
            )
            say("ready")
        elif cmd["op"] == "go":
            assert dataset is not None
            start = time.perf_counter()
            ids = [int(s["sample_id"]) for pack in PackLoader(dataset) for s in pack]
            say("done", ids=ids, seconds=round(time.perf_counter() - start, 3))
            dataset = None
            gc.collect()


# -- harness --------------------------------------------------------------------------------
def namespaces_available() -> bool:
    """True if this process may give a child its own mount namespace and /dev/shm."""
    if not (shutil.which("unshare") and shutil.which("nsenter")):
        return False
    probe = "mount -t tmpfs tmpfs /dev/shm"
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Rank:
    """One rank process and a reader thread that queues its protocol lines."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.lines.put(json.loads(line[len(MARK) :]))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-40]

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, kind: str, timeout: float = 300.0) -> dict[str, Any]:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            got = None
        if got is None or got["kind"] != kind:
            tail = "".join(self.stderr[-20:])
            raise RuntimeError(f"rank process: expected {kind!r}, got {got!r}; stderr:\n{tail}")
        return got


def shard_bytes(directory: Path) -> int:
    """Bytes of shard files in a cache dir now (files evicted while we look count 0)."""
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("shard."):
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size
    return total


def write_dataset(local: Path, records: int, shard_bytes_limit: int) -> None:
    from bcl_stream.formats.mds_writer import CostedMDSWriter

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3.0, 0.8, records).astype(np.int64), 1, 512)
    with CostedMDSWriter(str(local), cost_model="tokens", size_limit=shard_bytes_limit) as out:
        for i, length in enumerate(lengths):
            out.write({"input_ids": np.full(int(length), i, dtype=np.uint32)})


def run_benchmark(
    *,
    work: Path,
    records: int,
    shard_size: int,
    runs: list[tuple[str, int | None]],
    nodes: int = 2,
    ranks_per_node: int | None = None,
    shard_group: int = 4,
    prefetch: int = 2,
    pack_size: int = 8,
    window: int = 8,
    isolate: bool | None = None,
) -> dict[str, Any]:
    """Write the dataset to a fresh moto server, read one epoch per run, count per node.

    ``runs``: (scope, cache_limit in shard-size units or None). ``ranks_per_node``: None picks
    2 where mount namespaces are available, else 1. ``isolate``: give each node its own
    ``/dev/shm`` (None: where available).
    """
    import boto3
    from moto.server import ThreadedMotoServer

    isolated = namespaces_available() if isolate is None else isolate
    per_node = ranks_per_node or (2 if isolated else 1)
    if per_node > 1 and not isolated:
        raise RuntimeError("2+ ranks per simulated node need mount namespaces (unshare -m)")
    world = nodes * per_node
    local = work / "dataset"
    write_dataset(local, records, shard_size)
    index = read_index(local)
    starts = np.concatenate([[0], np.cumsum(index.shard_counts)])
    max_shard = max(p.stat().st_size for p in local.glob("shard.*"))

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    creds = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(local.iterdir(), key=lambda p: p.name == "index.json"):
        client.upload_file(str(path), BUCKET, f"train/{path.name}")
    remote = f"s3://{BUCKET}/train"
    proxies = [FaultyProxy(port) for _ in range(nodes)]
    dist_port = free_port() if isolated else 0
    ranks: list[Rank] = []
    try:
        for rank in range(world):
            node = rank // per_node
            tmp = work / f"tmp{node}"
            tmp.mkdir(exist_ok=True)
            env = dict(
                os.environ,
                **creds,
                S3_ENDPOINT_URL=proxies[node].endpoint,
                # What streaming reads to coordinate a node. Without a process group each rank
                # is a one-rank world to streaming (it would otherwise start one over all
                # ranks, and the two node leaders would race for one /dev/shm name).
                RANK=str(rank) if isolated else "0",
                WORLD_SIZE=str(world) if isolated else "1",
                LOCAL_WORLD_SIZE=str(per_node) if isolated else "1",
                TMPDIR=str(tmp),
                PYTHONPATH=str(ROOT),
            )
            child = [sys.executable, "-m", __name__, str(rank), str(world), str(per_node)]
            child += [remote, str(dist_port)]
            if isolated and rank % per_node == 0:
                mount = 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"'
                argv = ["unshare", "-m", "sh", "-c", mount, *child]
            elif isolated:
                argv = ["nsenter", "-t", str(ranks[node * per_node].proc.pid), "-m", *child]
            else:
                argv = child
            ranks.append(Rank(argv, env))
            if rank % per_node == 0:
                ranks[-1].expect("alive")  # its namespace exists: the node's ranks may join
        for rank, r in enumerate(ranks):
            if rank % per_node:
                r.expect("alive")
            r.expect("started")
        results = []
        for i, (scope, limit_shards) in enumerate(runs):
            cache_limit = None if limit_shards is None else int(limit_shards * max_shard)
            cmd = {
                "op": "build",
                "scope": scope,
                "cache_limit": cache_limit,
                "pack_size": pack_size,
                "window": window,
                "shard_group": shard_group,
                "seed": 7,
                "prefetch": prefetch,
            }
            marks = [len(p.log) for p in proxies]
            caches = [work / f"run{i}" / f"node{n}" for n in range(nodes)]
            for rank, r in enumerate(ranks):
                r.send(**cmd, cache_dir=str(caches[rank // per_node]))
                if not isolated:  # node leaders register shared memory one after the other
                    r.expect("ready")
            if isolated:
                for r in ranks:
                    r.expect("ready")
            peaks = [shard_bytes(c) for c in caches]
            for r in ranks:
                r.send(op="go")
            done: list[dict[str, Any]] = []
            pending = list(ranks)
            while pending:
                peaks = [max(p, shard_bytes(c)) for p, c in zip(peaks, caches, strict=True)]
                for r in list(pending):
                    try:
                        got = r.lines.get_nowait()
                    except queue.Empty:
                        continue
                    if got is None or got["kind"] != "done":
                        raise RuntimeError(f"rank failed: {got!r}\n{''.join(r.stderr[-20:])}")
                    done.append(got)
                    pending.remove(r)
                time.sleep(0.01)
            results.append(
                summarize(scope, cache_limit, max_shard, per_node, done, proxies, marks, starts)
                | {"peak_cache_mb": [round(p / 2**20, 3) for p in peaks]}
            )
            if cache_limit is not None:
                results[-1]["cache_limit_respected"] = all(p <= cache_limit for p in peaks)
                results[-1]["overshoot_shards"] = round(
                    max(0, max(peaks) - cache_limit) / max_shard, 2
                )
            print(json.dumps({k: v for k, v in results[-1].items() if k != "per_node"}), flush=True)
        for r in ranks:
            r.send(op="exit")
    finally:
        for r in ranks:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
        for p in proxies:
            p.close()
        server.stop()
    return {
        "nodes": nodes,
        "ranks_per_node": per_node,
        "own_dev_shm_per_node": isolated,
        "records": records,
        "shards": len(index.shards),
        "max_shard_kb": round(max_shard / 1024, 1),
        "shard_group": shard_group,
        "prefetch": prefetch,
        "pack_size": pack_size,
        "window": window,
        "runs": results,
    }


def summarize(
    scope: str,
    cache_limit: int | None,
    max_shard: int,
    per_node: int,
    done: list[dict[str, Any]],
    proxies: list[Any],
    marks: list[int],
    starts: np.ndarray,
) -> dict[str, Any]:
    """Per-node GET counts of this run against the shards each node's ranks actually read."""
    fetched: list[dict[str, int]] = []
    index_gets: list[int] = []
    for proxy, mark in zip(proxies, marks, strict=True):
        counts: dict[str, int] = {}
        meta = 0
        for method, path in proxy.log[mark:]:
            name = urlparse(path).path.rsplit("/", 1)[-1]
            if method != "GET":
                continue
            if name.startswith("shard."):
                counts[name] = counts.get(name, 0) + 1
            else:
                meta += 1
        fetched.append(counts)
        index_gets.append(meta)
    needed: list[set[int]] = [set() for _ in proxies]
    all_ids: list[int] = []
    for got in done:
        ids = np.asarray(got["ids"], dtype=np.int64)
        all_ids += got["ids"]
        shards = np.searchsorted(starts, ids, side="right") - 1
        needed[got["rank"] // per_node].update(int(s) for s in np.unique(shards))
    names = [{int(n.split(".")[1]) for n in counts} for counts in fetched]
    distinct = set().union(*names)
    return {
        "scope": scope,
        "cache_limit_mb": None if cache_limit is None else round(cache_limit / 2**20, 3),
        "cache_limit_shards": None if cache_limit is None else round(cache_limit / max_shard, 2),
        "records_read": len(all_ids),
        "records_read_twice": len(all_ids) - len(set(all_ids)),
        "distinct_shards": len(distinct),
        "amplification": round(sum(len(n) for n in names) / max(len(distinct), 1), 4),
        "shards_on_two_nodes": sum(1 for s in distinct if sum(s in n for n in names) > 1),
        "duplicate_gets": [sum(c.values()) - len(c) for c in fetched],
        "unneeded_shards": [len(n - need) for n, need in zip(names, needed, strict=True)],
        "needed_not_fetched": [len(need - n) for n, need in zip(names, needed, strict=True)],
        "shard_gets": [sum(c.values()) for c in fetched],
        "index_gets": index_gets,
        "read_seconds": max(d["seconds"] for d in done),
    }


if __name__ == "__main__":  # a rank: RANK WORLD PER_NODE REMOTE DIST_PORT
    rank, world, per_node, remote, dist_port = sys.argv[1:]
    rank_main(int(rank), int(world), int(per_node), remote, int(dist_port))
