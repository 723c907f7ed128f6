"""Every command given an ``s3://`` path it cannot use fails in one line (exit 2) that names
the URL, the cause and the fix, within the retry bound: no botocore traceback (issue point 2).

The store is the loopback moto server; "no credentials" removes every credential source
(instance metadata disabled: no network but loopback), "no endpoint" points at a closed port.
Also point 13: writing to S3 prints no "exists and not empty" warning.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from cli_process import bcl_stream_cli, bcl_stream_cli_runs

pytestmark = [pytest.mark.slow, pytest.mark.shared_process]

PLAN = ["--world-size", "2", "--pack-size", "4", "--window", "2"]
BOUND_S = 120
"""No command may take longer: the retries are bounded (4 attempts with backoff), not a loop."""


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return bcl_stream_cli(*args, env=env, timeout=BOUND_S)


@pytest.fixture(scope="module")
def remote(moto_s3, dataset_writers) -> str:  # type: ignore[no-untyped-def]
    url = moto_s3("bcl-cli-errors") + "/ds"
    dataset_writers[0](url, 60)
    return url


def no_credentials() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials",
        AWS_CONFIG_FILE="/nonexistent/config",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return env


def no_endpoint() -> dict[str, str]:
    return {**os.environ, "S3_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}


def commands(remote: str, tmp: Path) -> dict[str, list[str]]:
    source = tmp / "in.jsonl"
    source.write_text(json.dumps({"text": "a short record"}) + "\n")
    return {
        "plan": ["plan", remote, *PLAN],
        "read": ["read", remote, *PLAN, "--rank", "0"],
        "simulate": ["simulate", "--dataset", remote, "--ranks", "2"],
        "inspect": ["inspect", remote],
        "annotate": ["annotate", remote, "--overwrite", "--no-progress"],
        "preprocess": ["preprocess", str(source), "--output", remote + "-new", "--no-progress"],
    }


CASES = {
    "no_credentials": (no_credentials, "credentials", "AWS_ACCESS_KEY_ID"),
    "no_endpoint": (no_endpoint, "cannot connect", "S3_ENDPOINT_URL"),
}
COMMANDS = ["plan", "read", "simulate", "inspect", "annotate", "preprocess"]


@pytest.fixture(scope="module")
def faults(
    remote: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], tuple[subprocess.CompletedProcess[str], float]]:
    """Every command under each fault: one process per fault runs the six commands in turn
    (``bcl_stream_cli_runs``: each its own exit code, stdout, stderr and seconds), which saves
    an interpreter start (7-8 s of CPU) per command: (case, command) -> (result, seconds)."""
    got = {}
    for case, (make_env, _, _) in sorted(CASES.items()):
        tmp = tmp_path_factory.mktemp(case)
        args = commands(remote, tmp)
        runs = bcl_stream_cli_runs(
            [args[c] for c in COMMANDS], tmp / "runs", env=make_env(),
            timeout=len(COMMANDS) * BOUND_S,
        )  # fmt: skip
        got.update({(case, command): run for command, run in zip(COMMANDS, runs, strict=True)})
    return got


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", COMMANDS)
def test_remote_fault_is_one_line(
    faults: dict[tuple[str, str], tuple[subprocess.CompletedProcess[str], float]],
    command: str,
    case: str,
) -> None:
    _, cause, fix = CASES[case]
    proc, seconds = faults[case, command]
    assert seconds < BOUND_S, f"{command} took {seconds:.0f} s: the retries are not bounded"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith(f"bcl-stream {command}: error: ")
    assert "s3://bcl-cli-errors/ds" in line  # the URL
    assert cause in line and fix in line, line  # the cause and the fix
    assert "Traceback" not in proc.stderr and "botocore" not in line


def test_missing_dataset_on_s3_is_named(remote: str) -> None:
    proc = cli(dict(os.environ), "plan", remote + "-nothing-here", *PLAN)
    assert proc.returncode == 2
    assert "no such dataset (nothing is stored under it)" in proc.stderr


def test_s3_preprocess_prints_no_staging_warning(remote: str, tmp_path: Path) -> None:
    args = commands(remote, tmp_path)["preprocess"]
    proc = cli(dict(os.environ), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exists and not empty" not in proc.stderr + proc.stdout
