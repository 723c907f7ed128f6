"""bcl_bench/text_corpora.py: the benchmark's real corpora keep their write order, mixtures are
written source by source, the tuning and held-out sets are disjoint, and the text builders
count tokens of the files they are given (on small planted files, not the machine's)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from bcl_bench import text_corpora


@pytest.fixture
def small_base(monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    base = {name: np.arange(1, 8) * (i + 1) for i, name in enumerate(text_corpora.BASE)}
    monkeypatch.setattr(text_corpora, "BASE", {k: (lambda v=v: v) for k, v in base.items()})
    return base


def test_at_least_eight_corpora_split_in_two_disjoint_halves() -> None:
    tune, held = set(text_corpora.TUNE), set(text_corpora.HELD_OUT)
    assert len(tune | held) >= 8 and not tune & held
    assert abs(len(tune) - len(held)) <= 1
    for name in text_corpora.NAMES:
        assert (
            name in text_corpora.BASE
            or name in text_corpora.MIXTURES
            or name.removeprefix("sorted:") in text_corpora.BASE
        ), name


def test_base_corpus_repeats_in_write_order_and_is_capped(small_base: dict) -> None:
    out = text_corpora.build("man", 17, 5)
    want = np.minimum(np.resize(small_base["man"], 17), 5)
    assert out.dtype == np.int64 and np.array_equal(out, want)


def test_mixture_is_written_source_by_source(small_base: dict) -> None:
    name = "mix:man+torch+changelogs"
    out = text_corpora.build(name, 10, 1000)
    parts = text_corpora.MIXTURES[name]
    want = np.concatenate(
        [np.resize(small_base[p], k) for p, k in zip(parts, (4, 3, 3), strict=True)]
    )
    assert np.array_equal(out, want)


def test_sorted_corpus_is_the_base_sorted(small_base: dict) -> None:
    out = text_corpora.build("sorted:man", 12, 1000)
    assert np.array_equal(out, np.sort(np.resize(small_base["man"], 12)))
    with pytest.raises(ValueError, match="unknown corpus 'nope'"):
        text_corpora.build("nope", 3, 10)


def test_text_files_are_tokenized_in_order_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text_corpora, "CACHE_DIR", tmp_path / "cache")
    files = []
    for i, text in enumerate(["one two three", "a much longer page " * 20, "x"]):
        path = tmp_path / f"p{i}.1.gz"
        path.write_bytes(gzip.compress(text.encode()))
        files.append(path)
    broken = tmp_path / "p9.1.gz"
    broken.write_bytes(b"not gzip")  # does not decompress: not a record
    files.append(broken)
    first = text_corpora._cached("t", files, text_corpora._texts(files))
    assert first.size == 3 and first[1] > first[0] > 0 and first[2] >= 1
    assert len(list((tmp_path / "cache").glob("t_cl100k_*.npy"))) == 1
    again = text_corpora._cached("t", files, lambda: iter(["changed"]))  # read from the cache
    assert np.array_equal(again, first)
