"""Every record read is written exactly once or counted under a reason (property test)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcl_stream.formats.dataset_files import open_file_layout
from bcl_stream.preprocess import preprocess
from bcl_stream.text.tokenizers import load_tokenizer

pytestmark = pytest.mark.shared_process

WORDS = ["alpha", "beta", "gamma", " ", "δέλτα", "\n", "42", "{}", "naïve"]
BAD = {
    "malformed_json": b'{"text": ',
    "missing_field": b'{"body": "x"}',
    "undecodable": b'{"text": "\xc3\x28"}',
    "empty_text": b'{"text": ""}',
    "bad_messages": b'{"messages": []}',
}

line = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(lambda ws: ("good", "".join(ws))),
    st.sampled_from(sorted(BAD)).map(lambda reason: ("bad", reason)),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(line, min_size=1, max_size=40),
    cap=st.integers(1, 30),
    policy=st.sampled_from(["truncate", "drop"]),
    fmt=st.sampled_from(["mds", "wds"]),
)
def test_records_are_written_or_counted(
    lines: list[tuple[str, str]], cap: int, policy: str, fmt: str
) -> None:
    tok = load_tokenizer("cl100k")
    good = [text for kind, text in lines if kind == "good"]
    if not any(policy == "truncate" or len(tok.ids(t)) <= cap for t in good):
        return  # nothing would be written: covered by the empty-output test
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        with open(src, "wb") as fh:
            for kind, value in lines:
                fh.write(
                    (json.dumps({"text": value}).encode() if kind == "good" else BAD[value]) + b"\n"
                )
        report = preprocess(
            [str(src)],
            str(Path(tmp) / "out"),
            format=fmt,
            skip_bad=True,
            max_record_tokens=cap,
            outliers=policy,
            progress=False,
            shard_size_limit=512,
            maxcount=7,
        )
        index = open_file_layout(Path(tmp) / "out", check=True).index
    counts = [len(tok.ids(t)) for t in good]
    kept = [min(n, cap) for n in counts if policy == "truncate" or n <= cap]
    assert report.records_read == len(lines)
    assert (
        report.records_written + sum(report.skipped_bad.values()) + report.outliers["dropped"]
        == report.records_read
    )
    assert report.skipped_bad == {
        r: n for r in BAD if (n := sum(1 for k, v in lines if k == "bad" and v == r))
    }
    assert index.tokens.tolist() == kept
    assert report.outliers["truncated"] == (
        sum(n > cap for n in counts) if policy == "truncate" else 0
    )
