"""Write a costed MDS dataset slowly (one record per few ms) so a test can SIGKILL it mid-write.

Usage: ``python slow_writer.py OUT N``. Records follow ``tests/conftest.py`` (record i holds i).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from bcl_stream.formats.mds_writer import CostedMDSWriter


def main(out: str, n: int) -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(2.5, 0.8, n).astype(np.int64), 1, 96)
    with CostedMDSWriter(out, cost_model="tokens", size_limit=4096) as writer:
        for i, length in enumerate(lengths):
            writer.write({"input_ids": np.full(int(length), i, dtype=np.uint32)})
            time.sleep(0.005)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
