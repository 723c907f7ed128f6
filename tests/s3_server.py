"""The tests' S3 store: a moto server in a process of its own (spawned), as a real store is.

Why not a server thread inside the test process, as moto's ``ThreadedMotoServer`` is usually
run: the readers' tests fork DataLoader workers from that process, and a fork copies whatever
locks the server's request threads hold at that instant into the workers, where no thread will
ever release them. A worker's downloads then hang until their deadline, every attempt (seen
once in a full run of the suite). A server in another process shares nothing with the forks.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue

START_TIMEOUT_S = 60.0


def _serve(ready: Queue[tuple[str, int]]) -> None:
    """The server process: start moto on a free port of 127.0.0.1, report it, serve until
    terminated."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    ready.put(server.get_host_and_port())
    threading.Event().wait()


def start() -> tuple[BaseProcess, str]:
    """A spawned moto server process and its endpoint ``http://127.0.0.1:PORT``."""
    context = mp.get_context("spawn")
    ready: Queue[tuple[str, int]] = context.Queue()
    process = context.Process(target=_serve, args=(ready,), name="moto-s3", daemon=True)
    process.start()
    try:
        host, port = ready.get(timeout=START_TIMEOUT_S)
    except Exception as exc:
        stop(process)
        raise RuntimeError(
            f"the moto S3 server did not start within {START_TIMEOUT_S:g} s"
        ) from exc
    return process, f"http://{host}:{port}"


def stop(process: BaseProcess) -> None:
    """End the server process and wait for it (its CPU then counts in the test's)."""
    process.terminate()
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join()
