"""Image sizes at preprocessing: the time per image of ``image_size`` against PIL reading the
header alone, and against decoding the pixels.

Why: preprocessing needs each image's (width, height) and nothing else (its patches and tokens
follow from it); the target is a time per image within 2x of reading the header, so that no
pixel is read. Images: JPEG, PNG and WebP of random pixels at sizes from 64 px to 3000 px a
side, written to a temporary directory (the page cache is warm: what is timed is parsing, not
the disk). Per image and format, the median of ``--repeats`` runs of (the first three in turn
within each repeat, so load changes on the shared machine fall on each alike):

- ``header``: ``PIL.Image.open(path).size`` (open the file, parse the header);
- ``image_size_path``: ``bcl_stream.vision.image_header.image_size(path)`` (the same plus the
  checks: missing, empty, bomb limit);
- ``image_size_bytes``: ``image_size(data)`` on bytes already read (what ``preprocess`` does:
  it reads the file's bytes to store them in the shard, then parses the header from memory);
- ``decode``: ``Image.open(path).load()`` (every pixel), for contrast.

Writes ``results/bench_image_headers.json``.
Usage: ``python tools/bench_image_headers.py [--quick]``.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bcl_bench.harness import RESULTS, bench_parser, write_result
from bcl_stream.vision.image_header import image_size

SIZES = [(64, 64), (320, 240), (640, 480), (1024, 768), (1920, 1080), (3000, 2000)]
FORMATS = ("JPEG", "PNG", "WEBP")


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _interleaved_us(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Median microseconds of each of ``fns``, run in turn within every repeat, so that a
    change of load on a shared machine falls on all of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return [1e6 * statistics.median(t) for t in times]


def _decode(path: Path) -> None:
    with Image.open(path) as im:
        im.load()


def _header(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def measure(repeats: int, sizes: list[tuple[int, int]]) -> dict[str, Any]:
    rows = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bcl_img_") as tmp:
        for fmt in FORMATS:
            for w, h in sizes:
                path = Path(tmp) / f"{w}x{h}.{fmt.lower()}"
                pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format=fmt)
                path.write_bytes(buf.getvalue())
                data = path.read_bytes()
                assert image_size(path, "bench") == (w, h) == image_size(data, "bench")
                header, by_path, by_bytes = _interleaved_us(
                    [
                        lambda p=path: _header(p),
                        lambda p=path: image_size(p, "bench"),
                        lambda d=data: image_size(d, "bench"),
                    ],
                    repeats,
                )
                row = {
                    "format": fmt,
                    "width": w,
                    "height": h,
                    "file_bytes": len(data),
                    "header_us": header,
                    "image_size_path_us": by_path,
                    "image_size_bytes_us": by_bytes,
                    "decode_us": 1e6
                    * _median_seconds(lambda p=path: _decode(p), max(3, repeats // 10)),
                }
                row["ratio_path_to_header"] = row["image_size_path_us"] / row["header_us"]
                row["ratio_bytes_to_header"] = row["image_size_bytes_us"] / row["header_us"]
                rows.append(row)
    worst = max(max(r["ratio_path_to_header"], r["ratio_bytes_to_header"]) for r in rows)
    return {
        "repeats": repeats,
        "rows": rows,
        "worst_ratio_to_header": worst,
        "target_ratio": 2.0,
        "meets_target": worst <= 2.0,
    }


def main() -> None:
    parser = bench_parser(
        __doc__, RESULTS / "bench_image_headers.json", quick="3 sizes, 50 repeats"
    )
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    sizes = SIZES[::2] if args.quick else SIZES
    result = measure(50 if args.quick else args.repeats, sizes)
    write_result(result, args.out)
    for r in result["rows"]:
        print(
            f"{r['format']:4} {r['width']:>4}x{r['height']:<4} header {r['header_us']:7.1f} us  "
            f"image_size(path) {r['image_size_path_us']:7.1f} us  "
            f"image_size(bytes) {r['image_size_bytes_us']:7.1f} us  "
            f"decode {r['decode_us']:9.1f} us"
        )
    print(f"worst ratio to the header: {result['worst_ratio_to_header']:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
