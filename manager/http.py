"""The manager's HTTP side: an ASGI application served by uvicorn in the manager's event loop.

Report ingest (``POST /v1/reports``) is the hot path, thousands of requests a second from the
agents, so it is answered by :class:`ManagerApp` directly, without a web framework. ``GET
/healthz`` (alive) and ``GET /readyz`` (publishing plans) are answered here too; every other path
goes to the ``api`` application when there is one (the REST API), else 404.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import uvicorn

from dnslb.errors import ProcessError
from manager.ingest import MAX_BODY, Rejected, ReportIngest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]


async def send_json(send: Send, status: int, body: object) -> None:
    payload = json.dumps(body).encode("utf-8")
    headers = [*_JSON, (b"content-length", str(len(payload)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class ManagerApp:
    """Routes the manager's HTTP requests."""

    def __init__(
        self,
        ingest: ReportIngest,
        *,
        ready: Callable[[], bool],
        api: ASGIApp | None = None,
    ) -> None:
        self.ingest = ingest
        self.ready = ready
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if path == "/v1/reports":
                await self._reports(scope, receive, send, method)
                return
            if path == "/healthz" and method == "GET":
                await send_json(send, 200, {"status": "alive"})
                return
            if path == "/readyz" and method == "GET":
                ready = self.ready()
                await send_json(send, 200 if ready else 503, {"ready": ready})
                return
        if self.api is not None:
            await self.api(scope, receive, send)
            return
        if scope["type"] == "http":
            await send_json(send, 404, {"error": "not found"})

    async def _reports(self, scope: Scope, receive: Receive, send: Send, method: str) -> None:
        if method != "POST":
            await send_json(send, 405, {"error": "use POST"})
            return
        token = _bearer(scope)
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await send_json(send, 413, {"error": f"report larger than {MAX_BODY} bytes"})
                self.ingest.counts["too_large"] += 1
                return
            if not message.get("more_body", False):
                break
        try:
            self.ingest.accept(token, bytes(body))
        except Rejected as rejected:
            await send_json(send, rejected.status, {"error": rejected.message})
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def listen(address: str, port: int) -> socket.socket:
    """A bound, listening TCP socket; a clear :class:`ProcessError` when it cannot be had."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise ProcessError(f"cannot listen on {address}:{port}: {exc.strerror}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class HttpServer(uvicorn.Server):
    """uvicorn, serving on a socket we bound, leaving signal handling to the manager."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    @classmethod
    def for_app(cls, app: ASGIApp) -> HttpServer:
        config = uvicorn.Config(
            app, lifespan="off", access_log=False, log_level="warning", server_header=False
        )
        return cls(config)
