"""Parts: one of N deterministic shares of a preprocessing or annotation run.

Why: one machine tokenizes about 3K records/s; a corpus of a billion records needs many
machines, each writing a complete costed sub-dataset that ``bcl-stream merge`` then joins
(as Mosaic Streaming's ``merge_index`` and LitData's ``optimize(num_nodes=...)`` do). Every
part is a pure function of (inputs, I, N), so a Slurm array task, a Ray task or a re-run of a
failed part computes the same share without talking to the others.

How inputs are cut (``preprocess --part I/N``): the inputs, concatenated in the order given,
are cut into N byte ranges of equal size; a record belongs to the part whose range holds its
first byte (a Parquet row counts as ``file size / rows`` bytes). Parts are balanced by bytes
whatever the file sizes (one 100 GB file or 10,000 small ones), and every record lands in
exactly one part. A part that starts inside a file counts the newlines before its start (no
parsing, at disk speed, a small fraction of tokenizing time) so its ``source`` names
(``file:line``) match a single run's.

How shards are cut (``annotate --part I/N``): contiguous runs of shards, as equal in number as
possible (writers cut shards of equal size).

Layout: part I of N is written under ``OUTPUT/part-I-of-N/`` with its own lock, its own index
and cost index; ``merge`` checks that parts 0..N-1 are all there, complete and alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from bcl_stream.io.remote import join
from bcl_stream.preprocess.sources import InputSlice

PART_NAME = re.compile(r"^part-(\d+)-of-(\d+)$")


@dataclass(frozen=True, slots=True)
class Part:
    """Part ``index`` (0-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(
                f"part {self.index}/{self.count}: expected I/N with N >= 1 and 0 <= I < N "
                "(parts are numbered from 0, as SLURM_ARRAY_TASK_ID is with --array=0-(N-1))"
            )

    @classmethod
    def parse(cls, text: str) -> Part:
        """``"3/16"`` -> ``Part(3, 16)``."""
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"--part {text!r}: expected I/N, for example 0/4")
        return cls(int(index), int(count))

    @classmethod
    def from_name(cls, name: str) -> Part | None:
        """The part a directory name ``part-I-of-N`` stands for (None for any other name)."""
        match = PART_NAME.match(name)
        return cls(int(match[1]), int(match[2])) if match else None

    @property
    def name(self) -> str:
        return f"part-{self.index}-of-{self.count}"

    def location(self, output: str) -> str:
        """Where the part is written: ``OUTPUT/part-I-of-N`` (a directory or a URL)."""
        return join(output, self.name)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def input_slices(inputs: list[str], part: Part) -> list[InputSlice]:
    """The share of ``inputs`` that ``part`` reads (see the module docstring); files outside
    the part's byte range are left out, except that an empty file goes to the part holding
    its offset, which reports it."""
    sizes = [os.path.getsize(p) for p in inputs]
    total = sum(sizes)
    lo = total * part.index // part.count
    hi = total * (part.index + 1) // part.count
    last = part.index == part.count - 1
    out: list[InputSlice] = []
    offset = 0
    for path, size in zip(inputs, sizes, strict=True):
        owns_start = lo <= offset < hi or (last and offset == total)
        start, stop = max(lo, offset) - offset, min(hi, offset + size) - offset
        if start < stop or owns_start:
            out.append(InputSlice(path, start, None if stop >= size else stop, owns_start))
        offset += size
    return out


def shard_span(n_shards: int, part: Part) -> range:
    """The shards (by position) that ``part`` annotates: contiguous, sizes differ by <= 1."""
    return range(n_shards * part.index // part.count, n_shards * (part.index + 1) // part.count)


def input_identity(inputs: list[str]) -> list[list[str | int]]:
    """What every part records about the inputs it was cut from (path, size): ``merge``
    refuses parts cut from different inputs."""
    return [[path, os.path.getsize(path)] for path in inputs]


def part_record(part: Part, kind: str, inputs: object) -> dict[str, object]:
    """What a part stores in its cost index (``extra.part``) for ``merge`` to check: which
    part it is, what wrote it (``preprocess`` or ``annotate``) and what it was cut from."""
    return {"index": part.index, "count": part.count, "kind": kind, "inputs": inputs}
