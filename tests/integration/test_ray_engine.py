"""``preprocess --engine ray --parts N`` on a real local Ray cluster (2 worker CPUs, every
address on 127.0.0.1, one cluster for this file: it takes ~8 s to start): the merged result
equals a single run record for record, from the Python API and from the CLI joining the
cluster through ``RAY_ADDRESS``; a failed part is named, the finished ones are kept, and
the same command re-run runs only what failed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli
from parts_corpus import OPTIONS, assert_same, write_corpus

from bcl_stream.errors import DatasetError
from bcl_stream.preprocess import preprocess
from bcl_stream.preprocess.distributed import preprocess_parts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster of 2 CPUs on loopback; yields its address (for ``RAY_ADDRESS``)."""
    # Ray binds to the machine's routable address unless it believes it cannot cluster (read
    # once, at import): this keeps every port on 127.0.0.1.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:"), address
    try:
        yield address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("fmt", ["mds", "wds"])
def test_ray_parts_merge_to_the_single_run(
    ray_cluster: str, corpus: list[str], tmp_path: Path, fmt: str
) -> None:
    single = tmp_path / "single"
    preprocess(corpus, str(single), progress=False, workers=1, **OPTIONS[fmt])
    out = tmp_path / "out"
    if fmt == "mds":
        run = preprocess_parts(corpus, str(out), parts=3, workers=1, **OPTIONS[fmt])
        assert sorted(run.reports) == [0, 1, 2] and run.skipped == ()
        assert sum(r.records_written for r in run.reports.values()) == len(run.index)
    else:  # the command line, joining the running cluster as a user's job would
        env = {**os.environ, "RAY_ADDRESS": ray_cluster}
        result = bcl_stream_cli(
            "preprocess", *corpus, "--output", str(out), "--format", "wds", "--maxcount", "40",
            "--engine", "ray", "--parts", "3", "--workers", "1", "--json", env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["parts_run"] == [0, 1, 2] and summary["parts_skipped_complete"] == []
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        f"part-{i}-of-3" for i in range(3)
    ]
    assert_same(out, single, fmt, tmp_path)


def test_failed_part_is_named_and_only_it_reruns(
    ray_cluster: str, corpus: list[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n{"text": "fine too"}\n')
    inputs = [*corpus, str(bad)]  # the bad file is at the end: the last part reads it
    out = str(tmp_path / "out")
    with pytest.raises(DatasetError, match=r"1 of 3 parts failed \(2/3\).*bad\.jsonl:2.*again"):
        preprocess_parts(inputs, out, parts=3, workers=1, **OPTIONS["mds"])
    assert not (tmp_path / "out" / "index.json").exists()  # nothing merged
    run = preprocess_parts(inputs, out, parts=3, workers=1, skip_bad=True, **OPTIONS["mds"])
    assert run.skipped == (0, 1) and sorted(run.reports) == [2]
    assert run.reports[2].skipped_bad == {"malformed_json": 1}
    single = tmp_path / "single"
    preprocess(inputs, str(single), progress=False, workers=1, skip_bad=True, **OPTIONS["mds"])
    assert_same(tmp_path / "out", single, "mds", tmp_path)
