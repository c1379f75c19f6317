"""The lab's origin: a web server answering ``GET /objects/N`` with the catalog's bytes.

``dnslb origin`` runs it (the lab starts it as a child process). Every object is cacheable for
``max_age`` seconds (``Cache-Control: public, max-age=...``), so the cache servers ask for each
one once and serve it from their caches after that, as a real cache tier does; ``GET /healthz``
answers ``ok``. Bodies are generated, not stored: object N is its size in repeated bytes.
Threads serve connections (keep-alive), which is ample for the few misses the caches send.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from dnslb.config import checked, setting
from dnslb.errors import ProcessError
from lab.objects import ObjectCatalog

log = logging.getLogger("dnslb.origin")

_PATTERN = bytes(range(33, 127))


def body_of(size: int) -> bytes:
    """The deterministic body of an object of ``size`` bytes."""
    repeats, rest = divmod(size, len(_PATTERN))
    return _PATTERN * repeats + _PATTERN[:rest]


class OriginServer(ThreadingHTTPServer):
    """The origin's HTTP server; :meth:`serve_forever` until :meth:`shutdown`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: str, port: int, catalog: ObjectCatalog, max_age: int) -> None:
        self.catalog = catalog
        self.max_age = max_age
        self.hits = 0
        self._lock = threading.Lock()
        try:
            super().__init__((address, port), _Handler)
        except OSError as exc:
            raise ProcessError(
                f"origin cannot listen on {address}:{port}: {exc.strerror}"
            ) from None

    def count_hit(self) -> None:
        with self._lock:
            self.hits += 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: OriginServer

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain", cache=False, send_body=send_body)
            return
        index = self.server.catalog.index_of(self.path)
        if index is None:
            self._send(404, b"no such object\n", "text/plain", cache=False, send_body=send_body)
            return
        self.server.count_hit()
        body = body_of(self.server.catalog.size(index))
        self._send(200, body, "application/octet-stream", cache=True, send_body=send_body)

    def _send(
        self, status: int, body: bytes, content_type: str, *, cache: bool, send_body: bool
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if cache:
            self.send_header("Cache-Control", f"public, max-age={self.server.max_age}")
        else:
            self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would fill the disk under load


@dataclass(frozen=True, slots=True)
class OriginSettings:
    """Where the origin listens and what it serves."""

    address: str = setting("127.0.0.1", help="listen address")
    port: int = setting(8000, help="listen port", min=1, max=65535)
    objects: ObjectCatalog = setting(default_factory=ObjectCatalog, help="the objects it serves")
    max_age: int = setting(600, help="Cache-Control max-age of every object, seconds", min=0)


def serve(settings: OriginSettings) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit status (:class:`ConfigError` when
    ``settings`` are invalid)."""
    checked(settings, "origin")
    address, port, catalog = settings.address, settings.port, settings.objects
    server = OriginServer(address, port, catalog, settings.max_age)

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return: from another thread, not this handler.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"dnslb origin: serving {catalog.count} objects on http://{address}:{port}/objects/N",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    print(f"dnslb origin: stopped after {server.hits} object requests", flush=True)
    return 0
