"""A fault-injecting HTTP proxy on 127.0.0.1, put in front of a local moto S3 server.

Why a proxy and not ``ThreadedMotoServer.stop()``: stopping moto loses the port (the client's
endpoint), and cannot fail *some* requests. The proxy forwards every request unchanged, except:

- ``fail_next(n, status)``: the next ``n`` requests get an HTTP error (S3 ``SlowDown``-style);
- ``set_down(True)``: every request gets 503 until ``set_down(False)`` (the server "stops");
- ``fail_path(substring, n)``: the next ``n`` requests whose path contains ``substring`` fail;
- ``stall(substring)``: every request whose path contains ``substring`` is read and never
  answered (a store that accepts connections and hangs) until ``stall(None)`` or ``close()``.

It counts what it saw (``requests``, ``failed``), so a test can assert that retries are
bounded, and logs each request's method and path (``log``), so a benchmark can count which
objects were downloaded. Loopback only; it serves until ``close()``.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>injected fault</Message></Error>"
)
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}
STALL = -1
"""What ``_decide`` returns for a request to hold unanswered."""


class FaultyProxy:
    """Forwards to ``http://127.0.0.1:{upstream_port}``; faults as set by the methods below."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests = 0
        self.failed = 0
        self.log: list[tuple[str, str]] = []
        """(method, path) of every request, in arrival order."""
        self._lock = threading.Lock()
        self._fail_budget = 0
        self._fail_status = 503
        self._fail_substring: str | None = None
        self._down = False
        self._stall: str | None = None
        self._release = threading.Event()
        self.stalled = 0
        """Requests held without an answer so far."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                status = proxy._decide(self.path, self.command)
                if status == STALL:
                    proxy._release.wait()  # never answered; the client's timeout decides
                    self.close_connection = True
                    return
                if status is not None:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(ERROR_BODY)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(ERROR_BODY)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS
                    }
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _decide(self, path: str, method: str = "GET") -> int | None:
        with self._lock:
            self.requests += 1
            self.log.append((method, path))
            if self._stall is not None and self._stall in path:
                self.stalled += 1
                return STALL
            if self._down:
                self.failed += 1
                return 503
            matches = self._fail_substring is None or self._fail_substring in path
            if self._fail_budget > 0 and matches:
                self._fail_budget -= 1
                self.failed += 1
                return self._fail_status
            return None

    def fail_next(self, n: int, status: int = 503, path_contains: str | None = None) -> None:
        with self._lock:
            self._fail_budget, self._fail_status = n, status
            self._fail_substring = path_contains

    def stall(self, path_contains: str | None) -> None:
        """Hold every request whose path contains ``path_contains`` unanswered (None: stop
        stalling; the requests held so far are let go, answered with nothing)."""
        with self._lock:
            self._stall = path_contains
            if path_contains is None:
                self._release.set()
                self._release = threading.Event()

    def set_down(self, down: bool) -> None:
        with self._lock:
            self._down = down

    def counts(self) -> tuple[int, int]:
        """(requests seen, requests failed) so far."""
        with self._lock:
            return self.requests, self.failed

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
