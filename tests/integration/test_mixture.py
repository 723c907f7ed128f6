"""Mixtures end to end: real MDS and WebDataset streams, the CLI, the reader, resume and
Lightning (a Trainer fit, resumed from a mid-epoch checkpoint, logging each record's stream)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cli_process import bcl_stream_cli
from conftest import record_lengths, write_mds, write_wds
from lightning_scripts.harness import (
    cli_fit,
    cli_run_config,
    make_trainer,
    pack_log,
    tiny_config,
)
from resume_harness import check_resumed_log, check_resumed_runs, run_test_save_load_state, take

from bcl_stream.epoch.full_plan import full_plan
from bcl_stream.epoch.plan import ReaderConfig
from bcl_stream.errors import StateError
from bcl_stream.formats.mixture_reader import MixturePackDataset
from bcl_stream.loading.loader import PackLoader
from lightning_module.datamodule import BCLDataModule
from lightning_module.tinygpt import TinyGPT

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SIZES = {"a": (300, 0), "b": (200, 1), "c": (150, 2)}  # records, seed (lengths differ)


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    write_mds(root / "a", 300, seed=0)
    write_mds(root / "b", 200, seed=1)
    write_wds(root / "c", 150, seed=2)
    return {name: root / name for name in SIZES}


def specs(streams: dict[str, Path]) -> list[str]:
    return [f"{streams['a']}:proportion=0.5", f"{streams['b']}:proportion=0.3",
            f"{streams['c']}:proportion=0.2"]  # fmt: skip


def check_record(record: dict[str, Any], names: list[str]) -> None:
    """Record i of a stream holds [i] * L_i with that stream's lengths: the right stream read."""
    n, seed = SIZES[names[record["stream"]]]
    sid = record["sample_id"]
    assert record["input_ids"].size == record_lengths(n, seed)[sid]
    assert int(record["input_ids"][0]) == sid


def stream_args(streams: dict[str, Path]) -> list[str]:
    return [arg for spec in specs(streams) for arg in ("--stream", spec)]


def test_plan_and_read_agree_and_account_for_every_record(streams: dict[str, Path]) -> None:
    opts = ["--world-size", "2", "--pack-size", "4", "--window", "4", "--epoch", "1", "--json"]
    plan = bcl_stream_cli("plan", *stream_args(streams), *opts)
    assert plan.returncode == 0, plan.stderr
    out = json.loads(plan.stdout)
    assert [s["path"] for s in out["streams"]] == [str(streams[n]) for n in SIZES]
    for s in out["streams"]:
        assert s["records_used"] + sum(s["records_left"].values()) == s["records_drawn"]
    for rank in range(2):
        read = bcl_stream_cli("read", *stream_args(streams), *opts, "--rank", str(rank))
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["packs"] == out["ranks"][rank]["packs"]
    bad = bcl_stream_cli(
        "plan", *stream_args(streams), "--stream", f"{streams['a']}:repeat=2", *opts
    )
    assert bad.returncode != 0 and "named twice" in bad.stderr


def test_reader_yields_the_plan_with_the_right_records(streams: dict[str, Path]) -> None:
    names = list(SIZES)
    config = ReaderConfig.build(world_size=2, pack_size=4, window=4, seed=3)
    seen: list[tuple[int, int]] = []
    for rank in range(2):
        dataset = MixturePackDataset(specs(streams), config, rank)
        expected = full_plan(dataset.index, config, 0).rank_packs(rank)
        stream, local = dataset.mixture.locate(expected)
        packs = list(PackLoader(dataset, num_workers=1 if rank else 0))
        assert len(packs) == expected.shape[0]
        for pack, srow, lrow in zip(packs, stream, local, strict=True):
            assert [(r["stream"], r["sample_id"]) for r in pack] == list(
                zip(srow, lrow, strict=True)
            )
            for record in pack:
                check_record(record, names)
                seen.append((record["stream"], record["sample_id"]))
    drawn = dataset.mixture.draw(3, 0).per_stream()
    counts = np.bincount([s for s, _ in seen], minlength=3)
    assert np.all(counts <= drawn) and abs(counts / counts.sum() - [0.5, 0.3, 0.2]).max() < 0.02


def test_resume_equals_the_uninterrupted_run_and_a_changed_mixture_is_refused(
    streams: dict[str, Path],
) -> None:
    config = ReaderConfig.build(world_size=2, pack_size=4, window=4)

    def loader() -> PackLoader:
        return PackLoader(MixturePackDataset(specs(streams), config, 1))

    def key(pack: list[dict[str, Any]]) -> tuple[tuple[int, int], ...]:
        return tuple((int(r["stream"]), int(r["sample_id"])) for r in pack)

    run_test_save_load_state(loader, epochs=1, positions=[7], key=key)
    first = loader()
    take(first, 7, key)
    state = json.loads(json.dumps(first.state_dict()))
    assert [s["path"] for s in state["mixture"]] == [str(streams[n]) for n in SIZES]

    reweighted = [specs(streams)[0], f"{streams['b']}:proportion=0.4", specs(streams)[2]]
    with pytest.raises(StateError, match=re.escape("proportion 0.3 -> 0.4")):
        PackLoader(MixturePackDataset(reweighted, config, 1)).load_state_dict(state)
    restart = PackLoader(
        MixturePackDataset(reweighted, config, 1), on_mixture_change="restart_epoch"
    )
    restart.load_state_dict(state)
    assert (restart.epoch, restart.packs_consumed) == (0, 0)


def test_lightning_fit_resumes_a_mixture_and_logs_streams(
    streams: dict[str, Path], tmp_path: Path
) -> None:
    def module() -> BCLDataModule:
        return BCLDataModule(streams=specs(streams), plan={"pack_size": 4, "window": 4}, seed=1)

    def fit(workdir: Path, ckpt: Path | None = None) -> None:
        torch.manual_seed(0)
        trainer = make_trainer(workdir, max_epochs=1, save_at=(6,))
        trainer.fit(TinyGPT(tiny_config()), module(), ckpt_path=ckpt)

    full = tmp_path / "full"
    fit(full)
    log = pack_log(full)
    assert all(len(line["streams"]) == 4 for line in log)
    assert {s for line in log for s in line["streams"]} == {0, 1, 2}

    def resume(step: int) -> list[tuple[Any, ...]]:
        fit(tmp_path / "resumed", full / "ckpt" / f"step={step}.ckpt")
        return steps_and_streams(pack_log(tmp_path / "resumed"))

    check_resumed_runs(steps_and_streams(log), resume, [6])


def steps_and_streams(log: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(step, epoch, record ids, their streams) per logged step."""
    return [(x["step"], x["epoch"], x["sample_ids"], x["streams"]) for x in log]


def test_simulate_and_inspect_take_streams(streams: dict[str, Path]) -> None:
    sim = bcl_stream_cli("simulate", *stream_args(streams), "--ranks", "2", "--pack-size", "4",
              "--window", "4", "--strategies", "sequential,bcl-rank,verl_kk", "--json")  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    out = json.loads(sim.stdout)
    drawn = sum(s["records_drawn"] for s in out["streams"])
    assert out["config"]["records"] == drawn
    for name, m in out["strategies"].items():
        assert m["records_used"] + m["records_left"] == drawn, name
    inspect = bcl_stream_cli("inspect", *stream_args(streams), "--json")
    assert inspect.returncode == 0, inspect.stderr
    reports = json.loads(inspect.stdout)["streams"]
    assert [r["mixture"]["proportion"] for r in reports] == [0.5, 0.3, 0.2]
    assert sum(r["mixture"]["records_per_epoch"] for r in reports) == sum(
        n for n, _ in SIZES.values()
    )


def test_a_mixture_with_remote_streams_reads_each_into_its_own_cache(  # type: ignore[no-untyped-def]
    moto_s3, streams: dict[str, Path], tmp_path: Path
) -> None:
    """An s3:// MDS stream and an s3:// WebDataset stream beside a local one: each remote
    stream caches under its own directory, and the packs equal the plan."""
    mds_remote = moto_s3("mix-mds") + "/b"
    wds_remote = moto_s3("mix-wds") + "/c"
    write_mds(mds_remote, 200, seed=1)
    write_wds(wds_remote, 150, seed=2)
    mixed = [f"{streams['a']}:proportion=0.5", f"{mds_remote}:proportion=0.3",
             f"{wds_remote}:proportion=0.2"]  # fmt: skip
    config = ReaderConfig.build(world_size=2, pack_size=4, window=4)
    dataset = MixturePackDataset(mixed, config, 0, cache_dir=tmp_path / "cache")
    expected = full_plan(dataset.index, config, 0).rank_packs(0)
    stream, local = dataset.mixture.locate(expected)
    packs = list(PackLoader(dataset))
    assert [[(r["stream"], r["sample_id"]) for r in p] for p in packs] == [
        list(zip(s, i, strict=True)) for s, i in zip(stream.tolist(), local.tolist(), strict=True)
    ]
    for pack in packs:
        for record in pack:
            check_record(record, list(SIZES))
    assert (tmp_path / "cache" / "stream-1" / "bcl_index.json").is_file()
    assert (tmp_path / "cache" / "stream-2" / "bcl_index.json").is_file()
    assert not (tmp_path / "cache" / "stream-0").exists()  # the local stream is read in place


def mixture_config(tmp: Path, name: str, streams: dict[str, Path], stop: int) -> Path:
    """configs/mixture.yaml on the fixture streams, with this run's logs and checkpoints."""
    weights = dict(zip(SIZES, (0.5, 0.3, 0.2), strict=True))
    data = {
        "streams": [{"path": str(streams[n]), "proportion": w} for n, w in weights.items()],
        "plan": {"pack_size": 4, "window": 4},
        "loader": {"num_workers": 1},
        "seed": 5,
    }
    return cli_run_config(ROOT / "configs" / "mixture.yaml", tmp, name, stop, data)


def lightning_fit(config: Path, *extra: str) -> None:
    cli_fit(ROOT, config, *extra)


def test_ddp_mixture_from_the_yaml_config_resumes_per_rank(
    streams: dict[str, Path], tmp_path: Path
) -> None:
    """configs/mixture.yaml through LightningCLI on 2 gloo ranks: every record of the draw once
    (copies counted), and a run resumed at step 6 equals the uninterrupted one on each rank."""
    stop = 6
    lightning_fit(mixture_config(tmp_path, "full", streams, stop))
    full = [pack_log(tmp_path / "full", rank) for rank in range(2)]
    seen = [(s, i) for rank in full for x in rank for s, i in zip(x["streams"], x["sample_ids"], strict=True)]  # fmt: skip
    counts = np.bincount([s for s, _ in seen], minlength=3) / len(seen)
    assert np.abs(counts - [0.5, 0.3, 0.2]).max() < 0.02
    assert all(len(rank) == len(full[0]) for rank in full)
    ckpt = tmp_path / "full" / "ckpt" / f"step={stop}.ckpt"
    lightning_fit(mixture_config(tmp_path, "resumed", streams, stop), "--ckpt_path", str(ckpt))
    for rank in range(2):  # one resumed DDP run, compared rank by rank
        resumed = steps_and_streams(pack_log(tmp_path / "resumed", rank))
        check_resumed_log(steps_and_streams(full[rank]), stop, resumed)
