"""Character ranges to token spans (``text/token_ranges.py``): the spans found from a
``tokenizers`` encoding by the tokens at the ranges' ends are those of the rule over every
token's first character, on byte-level BPE (characters split over several tokens) and on a
tokenizer whose tokens leave characters unheld (spaces), where it falls back to the rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from bcl_stream.text.token_ranges import encoding_spans, token_spans
from tests.hf_tokenizers import build_tokenizer_dir

TEXT = "The fox 🦊 jumps; 狐狸跳过了 the lazy dog.\n\n<|eot_id|>Ünïcödé  spaced   out  "


def _every_range(encoding: object) -> None:
    starts = np.asarray([a for a, _ in encoding.offsets], dtype=np.int64)  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    cuts = [(a, b) for a in range(len(TEXT)) for b in range(a, len(TEXT) + 1)]
    for k in rng.choice(len(cuts), 600, replace=False):
        ranges = [cuts[k]]
        assert encoding_spans(encoding, ranges).tolist() == token_spans(starts, ranges).tolist()
    many = sorted(cuts[k] for k in rng.choice(len(cuts), 5, replace=False))
    assert encoding_spans(encoding, many).tolist() == token_spans(starts, many).tolist()


def test_byte_level_bpe(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(build_tokenizer_dir(tmp_path) / "tokenizer.json"))
    encoding = tok.encode(TEXT, add_special_tokens=False)
    pieces = [a for a, _ in encoding.offsets]
    assert len(pieces) > len(set(pieces))  # some characters are several tokens
    _every_range(encoding)


def test_characters_no_token_holds() -> None:
    words = sorted(set(TEXT.split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, "[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    encoding = tok.encode(TEXT, add_special_tokens=False)
    assert encoding.char_to_token(TEXT.index(" ")) is None
    _every_range(encoding)


@pytest.mark.parametrize("ranges", [[], [(3, 3)]])
def test_nothing_to_cover(ranges: list[tuple[int, int]], tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(build_tokenizer_dir(tmp_path) / "tokenizer.json"))
    assert encoding_spans(tok.encode("abc", add_special_tokens=False), ranges).tolist() == []
