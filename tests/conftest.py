"""Shared fixtures: tiny costed datasets (MDS and WebDataset) and a loopback S3 server.

Records are built so a test can check what it read: record ``i`` has ``input_ids`` filled
with the value ``i`` and a length drawn from a skewed distribution (so plans are not trivial).
Datasets are small (hundreds of records, several shards) to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

from bcl_stream.vision.components import RecordComponents

# Property tests draw the same examples on every run of the suite (a CI run passes or fails
# for the code, not for the draw). HYPOTHESIS_PROFILE=explore draws fresh examples: run it
# when changing the planner or the cursor, and turn any failure into a fixed case.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def record_lengths(n: int, seed: int = 0, max_len: int = 96) -> np.ndarray:
    """Skewed lengths in [1, max_len]: many short records, a few long ones."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(2.5, 0.8, n).astype(np.int64), 1, max_len)


def records(n: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Record i: ``input_ids`` = [i] * L_i (uint32)."""
    for i, length in enumerate(record_lengths(n, seed)):
        yield {"input_ids": np.full(int(length), i, dtype=np.uint32)}


def write_dataset(
    fmt: str, out: str | Path, n: int, *, seed: int = 0, images: bool = False, **shards: Any
) -> None:
    """A costed dataset of :func:`records`' ``n`` records in ``fmt``: MDS shards of about
    ``size_limit`` bytes (4096 unless given), WebDataset shards of ``maxcount`` records (37
    unless given); ``images``: with image-text cost components (:func:`image_components`)."""
    from bcl_stream.formats.mds_writer import CostedMDSWriter
    from bcl_stream.formats.wds_writer import CostedWDSWriter

    writer_type, defaults = {
        "mds": (CostedMDSWriter, {"size_limit": 4096}),
        "wds": (CostedWDSWriter, {"maxcount": 37}),
    }[fmt]
    with writer_type(str(out), cost_model="tokens", **(defaults | shards)) as writer:
        for record in records(n, seed):
            writer.write(record)
        if images:
            seal_components(writer, n, seed)


def write_mds(out: str | Path, n: int, **options: Any) -> None:
    """:func:`write_dataset` in MDS (``seed``, ``size_limit``, ``images``)."""
    write_dataset("mds", out, n, **options)


def write_wds(out: str | Path, n: int, **options: Any) -> None:
    """:func:`write_dataset` in WebDataset (``seed``, ``maxcount``, ``images``)."""
    write_dataset("wds", out, n, **options)


def written_files(root: Path) -> dict[str, bytes]:
    """Every file a writer left in ``root`` (name -> bytes): two writers' outputs compared
    byte for byte."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def image_components(n: int, seed: int = 0) -> RecordComponents:
    """Cost components of :func:`records`' ``n`` records as if most held an image: of record
    i's L_i tokens, a random share (at least one text token) are the image tokens of one image
    of 4 patches per token (Qwen2-VL's 2 x 2 merge); every fifth record, and any of one token,
    is text only. Text and image sizes vary apart, so a plan balanced in sum leaves the
    vision term unbalanced (what the two-term refinement fixes)."""
    lengths = record_lengths(n, seed)
    rng = np.random.default_rng(seed + 1)
    rows = []
    for i, length in enumerate(lengths.tolist()):
        if i % 5 == 0 or length < 2:
            rows.append((length, 0, []))
            continue
        image = int(rng.integers(1, length))
        rows.append((length - image, image, [4 * image]))
    return RecordComponents.build(rows)


def seal_components(writer: Any, n: int, seed: int) -> None:
    """Name :func:`image_components` in a costed writer's index, as ``preprocess
    --processor`` does (``vision/preprocess.py``), before the writer finishes."""
    from bcl_stream.vision.components import COMPONENTS_KEY, write_components

    writer.extra[COMPONENTS_KEY] = write_components(writer.local, image_components(n, seed))


@pytest.fixture(scope="session")
def dataset_writers() -> tuple[Callable[..., None], Callable[..., None]]:
    """``(write_mds, write_wds)`` for tests that need their own dataset (sizes, remotes)."""
    return write_mds, write_wds


@pytest.fixture(scope="session")
def mds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-record MDS dataset (about a dozen shards)."""
    root = tmp_path_factory.mktemp("mds") / "ds"
    write_mds(root, 300)
    return root


@pytest.fixture(scope="session")
def wds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-record WebDataset dataset (9 shards of 37 records, the last shorter)."""
    root = tmp_path_factory.mktemp("wds") / "ds"
    write_wds(root, 300)
    return root


@pytest.fixture(scope="session")
def vlm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``mds_dir`` and ``wds_dir``'s records with image-text cost components
    (:func:`image_components`), by format; read them with a two-term ``cost_model``."""
    out = {}
    for fmt, write in (("mds", write_mds), ("wds", write_wds)):
        out[fmt] = tmp_path_factory.mktemp(f"{fmt}_vlm") / "ds"
        write(out[fmt], 300, images=True)
    return out


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    """``lengths.npy``: 2048 token counts for ``bcl-stream simulate --lengths``."""
    from shard_tables import lognormal_lengths

    path = tmp_path / "lengths.npy"
    np.save(path, lognormal_lengths(2048, seed=1))
    return path


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Callable[[str], str]]:
    """A moto S3 server on 127.0.0.1, in a process of its own (:mod:`s3_server` says why);
    yields ``make_bucket(name) -> "s3://name"``.

    Sets ``S3_ENDPOINT_URL`` and dummy credentials for the session (streaming's S3 client and
    boto3 both read them).
    """
    import boto3
    import s3_server

    server, endpoint = s3_server.start()
    env = {
        "S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def make_bucket(name: str) -> str:
        client.create_bucket(Bucket=name)
        return f"s3://{name}"

    try:
        yield make_bucket
    finally:
        s3_server.stop(server)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Where a group's CPU goes (BCL_TEST_CPU=FILE): each test's CPU seconds, this process's and
# those of the descendants waited for (subprocesses, DDP ranks, servers stopped), written as
# JSON when the session ends, slowest first; a module or session fixture counts in the first
# test that uses it. Wall time alone misleads on a loaded machine. Not counted: a process no
# one waits for (one that outlives its parent goes to init), as in the runner's group CPU.
_CPU_REPORT = os.environ.get("BCL_TEST_CPU")
_cpu_seconds: dict[str, float] = {}


def _cpu_now() -> float:
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


if _CPU_REPORT:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        before = _cpu_now()
        yield
        _cpu_seconds[item.nodeid] = round(_cpu_now() - before, 2)

    def pytest_sessionfinish(session: pytest.Session) -> None:
        ordered = dict(sorted(_cpu_seconds.items(), key=lambda kv: -kv[1]))
        Path(_CPU_REPORT).write_text(json.dumps(ordered, indent=0) + "\n")
