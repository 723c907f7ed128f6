"""The tar scanner treats every length, size and name in a header as hostile (issue 42,
findings 2 and 4): each crafted header below is a ``TarFormatError`` naming the byte offset
(callers add the shard), within a second, never a hang, a huge read or an exception from
``int()``.

Before the fix: a pax record length of 0 (or a negative one, or a negative pax ``size``)
looped forever; a GNU base-256 size of 2**86 raised ``OverflowError``; a size field of NUL
bytes and text raised ``ValueError: invalid literal for int()``; member names that are
absolute or climb out (``..``) were yielded as record keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from watchdog import within

from bcl_stream.errors import DatasetError
from bcl_stream.formats.dataset_files import tar_record_counts
from bcl_stream.formats.tar_scan import (
    BLOCK,
    MAX_EXTENDED,
    TAR_ERRORS,
    TarFormatError,
    member_spans,
    tar_members,
    tar_records,
)

BOUND_S = 5.0


def header(name: bytes, size: int | bytes, kind: bytes = b"0") -> bytes:
    """A ustar header block with a valid checksum; ``size`` as octal, or the raw 12 bytes."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size if isinstance(size, bytes) else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def pax_record(key: str, value: str) -> bytes:
    """``"LEN key=value\\n"`` with LEN counting itself."""
    body = f" {key}={value}\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return f"{n}{body}".encode()


def tar(*blocks: bytes) -> bytes:
    return b"".join(blocks) + bytes(2 * BLOCK)


def member(name: bytes = b"0000000000.json", payload: bytes = b'{"a": 1}') -> bytes:
    return header(name, len(payload)) + padded(payload)


def pax(data: bytes) -> bytes:
    return header(b"././@PaxHeader", len(data), b"x") + padded(data)


CASES: dict[str, bytes] = {
    "pax length 0": tar(pax(b"0 path=x\n"), member()),
    "pax length negative": tar(pax(b"-9 path=a\n"), member()),
    "pax length past the header": tar(pax(b"99 path=a\n"), member()),
    "pax length not a number": tar(pax(b"1x path=a\n"), member()),
    "pax record without '='": tar(pax(b"9 pathx\n"), member()),
    "pax size negative": tar(pax(pax_record("size", "-512")), member()),
    "pax size not a number": tar(pax(pax_record("size", "12ab")), member()),
    "pax size past the end": tar(pax(pax_record("size", str(10**30))), member()),
    "pax path absolute": tar(pax(pax_record("path", "/etc/cron.d/x.json")), member()),
    "pax path climbing out": tar(pax(pax_record("path", "../../x.json")), member()),
    "base-256 size 2**86": tar(header(b"0.json", b"\x80" + (2**86).to_bytes(11, "big")), b""),
    "base-256 negative size": tar(header(b"0.json", b"\xff" * 12)),
    "size field of text and NULs": tar(header(b"0.json", b"12junk\0\0\0\0\0\0")),
    "pax size of NULs": tar(pax(pax_record("size", "\0" * 300)), member()),
    "size past the end": tar(header(b"0.json", 10**6)),
    "long name past the end": tar(header(b"././@LongLink", 2**40, b"L"), member()),
    "long name over the limit": tar(header(b"././@LongLink", MAX_EXTENDED + 1, b"L"))
    + bytes(MAX_EXTENDED + BLOCK),
    "member name absolute": tar(member(b"/tmp/0000000000.json")),
    "member name climbing out": tar(member(b"a/../../0000000000.json")),
    "checksum field not octal": tar(header(b"0.json", 8)[:148] + b"9" * 8 + bytes(356)),
}


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "shard-000000.tar"
    path.write_bytes(data)
    return path


def read_everything(path: Path) -> None:
    """What the readers, ``annotate`` and ``inspect`` do with a shard."""
    list(member_spans(path))
    for _, read in tar_members(path):
        read()
    list(tar_records(path))


@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_header_is_a_named_tar_error(tmp_path: Path, case: str) -> None:
    path = write(tmp_path, CASES[case])
    with pytest.raises(TarFormatError, match=r"at byte \d+") as caught:
        within(BOUND_S, lambda: read_everything(path), case)
    assert "invalid literal" not in str(caught.value)
    # what inspect, annotate and the reader's record count raise: the shard named
    with pytest.raises(DatasetError, match=r"shard-000000\.tar: unreadable tar shard"):
        within(BOUND_S, lambda: tar_record_counts(path), case)


def test_tar_format_error_is_a_tar_error() -> None:
    assert issubclass(TarFormatError, TAR_ERRORS)


def test_valid_pax_fields_still_apply(tmp_path: Path) -> None:
    """The checks refuse nothing a valid writer produces: a pax path, size and a record
    padded with NULs, a GNU long name, a base-256 size, ``./`` names."""
    payload = b"x" * 700
    data = tar(
        pax(pax_record("path", "dir/0000000000.json") + pax_record("size", "700")),
        header(b"ignored", 0) + padded(payload),
        header(b"././@LongLink", 21, b"L") + padded(b"./0000000001.json\0\0\0\0"),
        header(b"short", b"\x80" + (3).to_bytes(11, "big")) + padded(b"abc"),
    )
    path = write(tmp_path, data)
    got = [(name, read()) for name, read in tar_members(path)]
    assert got == [("dir/0000000000.json", payload), ("./0000000001.json", b"abc")]
