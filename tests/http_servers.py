"""Real HTTP servers that tests control: a manager stand-in that records reports, a slow origin.

Both run ``http.server`` in a thread on 127.0.0.1 and are context managers that stop them (and
close every connection) even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One request the receiver saw."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.monotonic() when it was recorded

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (the agent cancelled, the test stopping it) is not news.
        pass


class Receiver:
    """Records every request; answers with the status and body in ``answer`` (changeable).

    ``get_body`` is what a GET answers (a JSON application status for the json source).
    :meth:`stop` closes the listening socket and every open connection (the manager is down);
    :meth:`start` opens it again on the same port (the manager is back).
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.answer: tuple[int, bytes] = (204, b"")
        self.answer_headers: dict[str, str] = {}  # sent with ``answer`` (a redirect's Location)
        self.get_answer: tuple[int, bytes] = (200, b"{}")
        self.requests: list[Received] = []
        self.lock = threading.RLock()  # wait_for's predicate takes it again
        self.changed = threading.Condition(self.lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with owner.lock:
                    owner._connections.add(self.connection)

            def finish(self) -> None:
                with owner.lock:
                    owner._connections.discard(self.connection)
                super().finish()

            def _record(self, body: bytes) -> None:
                with owner.changed:
                    owner.requests.append(
                        Received(
                            self.command,
                            self.path,
                            dict(self.headers.items()),
                            body,
                            time.monotonic(),
                        )
                    )
                    owner.changed.notify_all()

            def _reply(
                self, status: int, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if len(body) < length:  # the client gave up (a cancelled agent) mid-request
                    self.close_connection = True
                    return
                self._record(body)
                self._reply(*owner.answer, owner.answer_headers)

            def do_GET(self) -> None:
                self._record(b"")
                self._reply(*owner.get_answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = _Server(("127.0.0.1", self.port), Handler)
        self.port = server.server_port
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self.lock:
            for connection in list(self._connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)

    def posts(self) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.method == "POST"]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate()`` holds (checked whenever a request arrives)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.1))
        return True

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SlowOrigin:
    """An origin that holds every request until :meth:`release` (or ``hold_limit`` seconds).

    ``held`` is how many requests it holds right now.
    """

    def __init__(self, hold_limit: float = 30.0) -> None:
        self.hold_limit = hold_limit
        self.released = threading.Event()
        self.held = 0
        self.served = 0
        self.lock = threading.Condition()
        self._server: _Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SlowOrigin:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with owner.lock:
                    owner.held += 1
                    owner.lock.notify_all()
                try:
                    owner.released.wait(owner.hold_limit)
                finally:
                    with owner.lock:
                        owner.held -= 1
                        owner.served += 1
                        owner.lock.notify_all()
                body = f"slow answer for {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_port
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def wait_held(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until exactly ``count`` requests are held."""
        with self.lock:
            return self.lock.wait_for(lambda: self.held == count, timeout)

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> SlowOrigin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
