"""Run the parts of a partitioned ``preprocess`` on a Ray cluster, then merge them.

Why Ray: teams that train on 16-128 nodes prepare data on Ray or Spark clusters; one task per
part (``preprocess --part I/N``, see ``preprocess/parts.py``) is the whole integration, since a
part is a pure function of (inputs, I, N) and writes its own complete sub-dataset. Ray is an
optional extra (``pip install 'bcl-stream[ray]'``) imported only here; the single-machine
``preprocess`` never imports it.

Where it runs: ``ray.init()`` joins the cluster ``RAY_ADDRESS`` (or ``address``) names, or
starts a local one. Each task asks for ``workers`` CPUs (its tokenizer processes), so Ray runs
as many parts at once as the cluster has cores for. Every node must see the inputs at the
same paths (a shared file system) and the output (a shared file system or ``s3://``), and
have bcl-stream installed.

Failures: parts that finished stay finished. Re-running the same command skips the parts
that are already complete (the merge still checks that they were cut from the same inputs
with the same options) and re-runs the others; a part left half-written is replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcl_stream.errors import BCLStreamError, DatasetError
from bcl_stream.io.index import CostIndex
from bcl_stream.io.remote import is_remote
from bcl_stream.preprocess.merge import merge
from bcl_stream.preprocess.output import is_complete, remote_listing
from bcl_stream.preprocess.parts import Part
from bcl_stream.preprocess.pipeline import PreprocessReport, preprocess

ENGINES = ("ray",)


@dataclass(frozen=True, slots=True)
class PartsRun:
    """What a distributed run did: the parts it wrote (their reports), the parts it found
    already complete and skipped, and the merged index."""

    reports: dict[int, PreprocessReport]
    skipped: tuple[int, ...]
    index: CostIndex


def part_is_complete(output: str, part: Part) -> bool:
    """Whether ``output/part-I-of-N`` holds a finished part (its completion marker)."""
    location = part.location(output)
    if is_remote(location):
        return is_complete(remote_listing(location))
    root = Path(location.removeprefix("file://"))
    return root.is_dir() and is_complete({p.name for p in root.iterdir()})


def _run_part(inputs: list[str], output: str, part: str, options: dict[str, Any]) -> Any:
    """One Ray task: a part, its report as a plain dict (picklable without our classes)."""
    return preprocess(inputs, output, part=part, progress=False, **options).to_dict()


def preprocess_parts(
    inputs: list[str],
    output: str,
    *,
    parts: int,
    engine: str = "ray",
    address: str | None = None,
    **options: Any,
) -> PartsRun:
    """Preprocess ``inputs`` as ``parts`` Ray tasks writing ``output/part-I-of-N``, then merge
    them into one dataset at ``output``. ``options``: those of :func:`preprocess` (``workers``
    is also the CPUs each task asks Ray for). ``overwrite`` re-runs complete parts too.

    A failed part raises :class:`DatasetError` naming it (with its cause chained) after every
    other part has finished; nothing is merged then.
    """
    if engine not in ENGINES:
        raise ValueError(f"--engine {engine!r}: expected one of {ENGINES}")
    if parts < 1:
        raise ValueError(f"--parts must be >= 1, got {parts}")
    try:
        import ray
    except ImportError as exc:
        raise DatasetError(
            "--engine ray needs Ray: pip install 'bcl-stream[ray]' (on every node of the cluster)"
        ) from exc
    todo = [
        i
        for i in range(parts)
        if options.get("overwrite") or not part_is_complete(output, Part(i, parts))
    ]
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or None)
    workers = max(1, int(options.get("workers", 2)))
    task = ray.remote(num_cpus=workers, max_retries=0)(_run_part)
    refs = {i: task.remote(list(inputs), output, f"{i}/{parts}", options) for i in todo}
    reports: dict[int, PreprocessReport] = {}
    failed: dict[int, BaseException] = {}
    for i, ref in refs.items():
        try:
            reports[i] = PreprocessReport(**ray.get(ref))
        except Exception as exc:  # RayTaskError wraps the part's own exception
            failed[i] = exc
    if failed:
        first = min(failed)
        cause = failed[first]
        own = getattr(cause, "cause", None)  # the part's exception inside RayTaskError
        message = str(own) if isinstance(own, BCLStreamError | ValueError | OSError) else cause
        raise DatasetError(
            f"{len(failed)} of {parts} parts failed ({', '.join(str(Part(i, parts)) for i in sorted(failed))}); "
            f"part {Part(first, parts)}: {message}. Fix the cause and run the same command "
            "again: finished parts are kept, failed ones re-run."
        ) from (own if isinstance(own, BaseException) else cause)
    index = merge(output)
    skipped = tuple(i for i in range(parts) if i not in todo)
    return PartsRun(reports, skipped, index)
