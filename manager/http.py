"""The manager's HTTP side: an ASGI application served by uvicorn in the manager's event loop.

Report ingest (``POST /v1/reports``) is the hot path, thousands of requests a second from the
agents, so it is answered by :class:`ManagerApp` directly, without a web framework. ``GET
/healthz`` (alive) and ``GET /readyz`` (publishing plans) are answered here too; every other path
goes to the ``api`` application when there is one (the REST API), else 404.

The listener faces every cache server, so it holds its ground against clients that are slow on
purpose (:class:`HttpLimits`): a request must deliver its headers, then its body, within a few
seconds; an answer may not wait long on a client that does not read; connections beyond a cap
are closed at once. uvicorn has a keep-alive timeout and a cap on concurrency (answered with 503,
which would let idle attackers refuse service to agents) but no read timeouts, so the limits are
kept by :class:`GuardedHttpProtocol`, uvicorn's own protocol with a small watchdog per
connection. A report's token is checked from the headers, before its body is read.

With TLS (``http.tls``), the handshake is done by the same protocol (``loop.start_tls``) rather
than by the listening socket, so that a connection counts against the cap from its first byte
and its TLS handshake is part of its first request's header time: a client that opens a
connection and never says hello is dropped like one that never sends its headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dnslb.asgi import ASGIApp, Receive, Scope, Send, bearer_token, declared_length, has_body
from dnslb.errors import ProcessError
from manager.ingest import Rejected, ReportIngest

log = logging.getLogger("dnslb.manager.http")


_JSON = [(b"content-type", b"application/json")]
_CLOSE = (b"connection", b"close")


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def send_json(
    send: Send,
    status: int,
    body: object,
    *,
    close: bool = False,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    payload = json.dumps(body).encode("utf-8")
    headers = [*_JSON, (b"content-length", str(len(payload)).encode("ascii")), *extra]
    if close:
        headers.append(_CLOSE)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _to_leader(send: Send, scope: Scope, url: str | None) -> None:
    """A standby's answer to a write: 307 to the same path at the leader (the method and body
    are repeated there), or 503 while no leader is known. The body is never read."""
    if url is None:
        await send_json(
            send,
            503,
            {"error": "no leader"},
            close=has_body(scope),
            extra=((b"retry-after", b"1"),),
        )
        return
    target = url.rstrip("/") + scope["path"]
    query = scope.get("query_string", b"")
    if query:
        target += "?" + query.decode("latin-1")
    await send_json(
        send,
        307,
        {"error": "not the leader", "leader": url},
        close=has_body(scope),
        extra=((b"location", target.encode("latin-1", "replace")),),
    )


class ManagerApp:
    """Routes the manager's HTTP requests."""

    def __init__(
        self,
        ingest: ReportIngest,
        *,
        ready: Callable[[], bool],
        api: ASGIApp | None = None,
        leader: Callable[[], tuple[bool, str | None]] | None = None,
        role: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        """``leader()``: (True while this manager is a standby, the leader's URL when known);
        ``role()``: ("leader" or "standby", epoch), shown by ``/healthz`` (it reads no
        database: a load balancer or a test can tell the leader even while the database is
        away)."""
        self.ingest = ingest
        self.ready = ready
        self.api = api
        self.leader = leader
        self.role = role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if self.leader is not None and method in _WRITES and path.startswith("/v1/"):
                standby, url = self.leader()
                if standby:
                    await _to_leader(send, scope, url)
                    return
            if path == "/v1/reports":
                await self._reports(scope, receive, send, method)
                return
            if path == "/healthz" and method == "GET":
                body: dict[str, object] = {"status": "alive"}
                if self.role is not None:
                    body["role"], body["epoch"] = self.role()
                await send_json(send, 200, body)
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
        # Token and declared length first, from the headers: nobody without a valid token makes
        # the manager read a body. When a refused request still has a body on the way, the
        # connection is closed rather than drained.
        try:
            credential = self.ingest.authenticate(bearer_token(scope))
            self.ingest.check_length(declared_length(scope))
        except Rejected as rejected:
            await send_json(
                send, rejected.status, {"error": rejected.message}, close=has_body(scope)
            )
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before the end of its body (or dropped as too slow)
            body += message.get("body", b"")
            try:
                self.ingest.check_length(len(body))  # sent in chunks, past what it declared
            except Rejected as rejected:
                await send_json(send, rejected.status, {"error": rejected.message}, close=True)
                return
            if not message.get("more_body", False):
                break
        try:
            self.ingest.record(credential, bytes(body))
        except Rejected as rejected:
            await send_json(send, rejected.status, {"error": rejected.message})
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


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


def default_max_connections() -> int:
    """Connections held at once: 4,096, or half the process's file descriptors when fewer (the
    manager needs the rest for its database, health checks and cloud calls)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(4096, soft // 2))


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What a client of the manager's listener may take: time, connections, header bytes.

    A request's headers must all arrive within ``header_timeout`` seconds of its first byte (of
    the connection, for its first request), and its body within ``body_timeout`` seconds of its
    headers; an answer may wait ``write_timeout`` seconds on a client that does not read it; an
    idle connection is closed after ``keep_alive`` seconds. A connection that breaks a limit is
    closed at once. Connections beyond ``max_connections`` are closed as they arrive. Request
    headers larger than ``max_header_bytes`` get 431 and the connection is closed.

    A request answered before its body was all in (a refused token, a body over the cap) and
    closed: the listener stops sending (a TCP half-close) and reads on, throwing the rest away,
    until the client closes, ``linger_time`` seconds pass or ``linger_bytes`` more arrive (nginx's
    lingering close). Closing at once would make the kernel answer the body's next bytes with a
    reset, and a client still sending its body could lose the answer before reading it.
    """

    header_timeout: float = 5.0
    body_timeout: float = 10.0
    write_timeout: float = 10.0
    keep_alive: int = 5
    max_connections: int = field(default_factory=default_max_connections)
    max_header_bytes: int = 32 * 1024
    linger_time: float = 2.0
    linger_bytes: int = 1024 * 1024


@dataclass(slots=True)
class HttpCounts:
    """What the listener's guard did, since it started."""

    slow_headers: int = 0  # connections closed: headers not in within header_timeout
    slow_bodies: int = 0  # connections closed: body not in within body_timeout
    slow_readers: int = 0  # connections closed: answer not taken within write_timeout
    long_lingers: int = 0  # connections cut: body still coming linger_time/bytes after the answer
    over_capacity: int = 0  # connections closed on arrival: max_connections reached
    large_headers: int = 0  # requests refused with 431
    malformed: int = 0  # requests the HTTP parser refused (400)
    failed_handshakes: int = 0  # TLS handshakes refused (not TLS, no shared version or cipher)

    def total(self) -> int:
        return (
            self.failed_handshakes
            + self.slow_headers
            + self.slow_bodies
            + self.slow_readers
            + self.long_lingers
            + self.over_capacity
            + self.large_headers
            + self.malformed
        )


class _Phase(Enum):
    IDLE = "idle"  # between requests (or no request yet)
    HEADERS = "headers"  # a request has begun; its headers are not all in
    BODY = "body"  # headers in, body not yet complete
    APP = "app"  # request complete, the answer is being made


_REPORT_EVERY = 60.0  # seconds between log lines about dropped clients


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request whose headers are too large."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a watchdog: read deadlines, a write deadline, a
    connection cap and a header size cap, and the TLS handshake when ``tls`` is set (within the
    first request's header time). ``limits``, ``counts`` and ``tls`` are set per server by
    :meth:`HttpServer.for_app` (on a subclass of its own)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    counts: ClassVar[HttpCounts] = HttpCounts()
    tls: ClassVar[ssl.SSLContext | None] = None
    _logged: ClassVar[list[float]] = [float("-inf"), 0.0]  # last log time, total then

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _Phase.IDLE
        self._read_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0  # bytes received since the request began, before its headers
        self._header_size = 0  # bytes of its URL and headers, as parsed
        self._headers_too_large = False
        # While the TLS handshake lasts: the TCP transport, and what came before connection_made
        # (the request may follow the handshake's last message in the same read).
        self._handshaking: asyncio.Transport | None = None
        self._early: list[bytes] | None = None
        self._handshake_task: asyncio.Task[None] | None = None
        self._made = False  # uvicorn's connection_made called: its connection_lost is due
        self._raw: asyncio.Transport | None = None  # the transport under _LingeringTransport
        self._linger_left = 0  # bytes a lingering close still throws away (> 0: lingering)

    # -- connection ------------------------------------------------------------------------

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self.counts.over_capacity += 1
            self._note()
            transport.abort()
            return
        # A new connection must deliver its first request's headers in time, like any request;
        # with TLS, the handshake first, within the same time.
        self._arm_read(self.limits.header_timeout, "headers")
        if self.tls is None:
            self._made = True
            super().connection_made(transport)
            self._wrap()
            return
        self._handshaking = transport
        self._early = []
        self.connections.add(self)  # counts against the cap while it shakes hands
        self._handshake_task = self.loop.create_task(self._handshake(transport, self.tls))

    async def _handshake(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        failure: OSError | None = None
        try:
            secured = await self.loop.start_tls(
                transport,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.limits.header_timeout,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            secured, failure = None, exc
        if self._handshaking is None:
            return  # dropped meanwhile (too slow, shut down), and counted then
        if secured is None or secured.is_closing():
            if isinstance(failure, ssl.SSLError):  # not TLS, no common version or cipher...
                self.counts.failed_handshakes += 1
                self._note()
            self._handshake_ended()
            transport.abort()
            return
        early = self._early or []
        self._handshaking = None
        self._early = None
        self._made = True
        super().connection_made(secured)
        self._wrap()
        for data in early:
            if self.transport.is_closing():
                break
            self.data_received(data)

    def _wrap(self) -> None:
        """uvicorn closes through ``self.transport`` (its request cycles keep a reference to
        it): a :class:`_LingeringTransport` lets a close that comes before the request's body
        is in become a lingering one."""
        self._raw = self.transport
        self.transport = _LingeringTransport(self.transport, self._close)

    def _close(self) -> None:
        raw = self._raw
        assert raw is not None
        if self._phase is not _Phase.BODY or raw.is_closing():
            raw.close()
            return
        # Answered before the body was all in: stop sending, read on and throw it away.
        self._cancel_read()
        self._linger_left = max(1, self.limits.linger_bytes)
        if raw.can_write_eof():  # plain TCP: the client sees the answer, then the end
            raw.write_eof()
        if not raw.is_reading():  # uvicorn's flow control pauses reading for a large body
            raw.resume_reading()
        self._read_timer = self.loop.call_later(self.limits.linger_time, self._linger_over)

    def _linger_over(self) -> None:
        self._read_timer = None
        raw = self._raw
        if raw is not None and not raw.is_closing():
            self.counts.long_lingers += 1
            self._note()
            raw.abort()

    def _handshake_ended(self) -> None:
        """The handshake failed or the connection went before it ended: forget it."""
        self._handshaking = None
        self._early = None
        self._cancel_read()
        self.connections.discard(self)

    def shutdown(self) -> None:
        if self._handshaking is not None:
            self._handshaking.abort()
            self._handshake_ended()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshaking is not None:
            self._handshake_ended()
        if not self._made:  # refused on arrival, or its TLS handshake never ended
            return
        self._cancel_read()
        self._cancel_write()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)  # decrypted before start_tls returned: fed to the parser then
            return
        if self._linger_left > 0:  # the rest of a refused body: thrown away, within a bound
            self._linger_left -= len(data)
            if self._linger_left <= 0:
                self._linger_over()
            return
        if self._phase in (_Phase.IDLE, _Phase.APP) and self._read_timer is None:
            # The first bytes of a request (after keep-alive idling, or pipelined).
            self._arm_read(self.limits.header_timeout, "headers")
        if self._phase is not _Phase.BODY:
            self._header_bytes += len(data)
        # What uvicorn does, but for its log lines: a client sending junk gets its 400 and is
        # counted, and the log says so now and then (a flood of junk must not flood the log).
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # nothing here speaks another protocol: it was answered as plain HTTP
        except httptools.HttpParserError:
            if self._headers_too_large:
                self._refuse_large_headers()
            else:
                self.counts.malformed += 1
                self._note()
                self.send_400_response("Invalid HTTP request received.")
            return
        if (
            self._phase in (_Phase.IDLE, _Phase.HEADERS)
            and self._header_bytes > self.limits.max_header_bytes
        ):
            self._refuse_large_headers()  # headers still not over, and already too many bytes

    def _refuse_large_headers(self) -> None:
        if self.transport.is_closing():
            return
        self.counts.large_headers += 1
        self._note()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.close()

    def _count_header(self, size: int) -> None:
        self._header_size += size
        if self._header_size > self.limits.max_header_bytes:
            self._headers_too_large = True
            raise _HeadersTooLarge

    # -- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._phase = _Phase.HEADERS
        self._header_size = 0
        if self._read_timer is None:
            # A request that began in the same bytes as the one before it (pipelined, or the
            # first bytes of a slow client's next request): its headers are due in time too.
            self._arm_read(self.limits.header_timeout, "headers")
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_header(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._phase = _Phase.BODY
        self._header_bytes = 0
        self._arm_read(self.limits.body_timeout, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_read()
        self._header_bytes = 0
        answered = self.cycle is not None and self.cycle.response_complete
        self._phase = _Phase.IDLE if answered else _Phase.APP
        if answered and self.timeout_keep_alive_task is None and not self.transport.is_closing():
            # Answered before its body was all in: uvicorn armed the keep-alive timeout then,
            # and the rest of the body cancelled it. Idle from now on, so it is due again.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase is _Phase.APP:
            self._phase = _Phase.IDLE
        # else: answered before its body was all in (a refused token); the body deadline holds
        super().on_response_complete()

    # -- writing -------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.write_timeout, self._slow_reader)
        super().pause_writing()

    def resume_writing(self) -> None:
        self._cancel_write()
        super().resume_writing()

    # -- the watchdog --------------------------------------------------------------------------

    def _arm_read(self, seconds: float, what: str) -> None:
        self._cancel_read()
        self._read_timer = self.loop.call_later(seconds, self._too_slow, what)

    def _cancel_read(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _cancel_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _too_slow(self, what: str) -> None:
        self._read_timer = None
        if self._handshaking is not None:  # no hello, or a handshake dragged out
            self.counts.slow_headers += 1
            self._note()
            self._handshaking.abort()
            self._handshake_ended()
            return
        if self.transport is None or self.transport.is_closing():
            return
        if what == "headers":
            self.counts.slow_headers += 1
        else:
            self.counts.slow_bodies += 1
        self._note()
        self.transport.abort()

    def _slow_reader(self) -> None:
        self._write_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        self.counts.slow_readers += 1
        self._note()
        self.transport.abort()

    def _note(self) -> None:
        """A log line now and then (never one per client: a flood must not flood the log)."""
        now = time.monotonic()
        last, total_then = self._logged
        if now - last < _REPORT_EVERY:
            return
        counts = self.counts
        log.warning(
            "closed %d connection(s) breaking the listener's limits since the last report (in "
            "all: %d slow headers, %d slow bodies, %d slow readers, %d refused bodies still "
            "coming after %.0f s or %d bytes, %d over %d connections, %d headers too large, %d "
            "malformed requests, %d failed TLS handshakes)",
            counts.total() - int(total_then),
            counts.slow_headers,
            counts.slow_bodies,
            counts.slow_readers,
            counts.long_lingers,
            self.limits.linger_time,
            self.limits.linger_bytes,
            counts.over_capacity,
            self.limits.max_connections,
            counts.large_headers,
            counts.malformed,
            counts.failed_handshakes,
        )
        self._logged[:] = [now, float(counts.total())]


class _LingeringTransport(asyncio.Transport):
    """The transport uvicorn is given: the real one, but for ``close``, which goes to the
    protocol (a lingering close while a request's body is on the way, else a close). Once
    lingering it reads as closing, so uvicorn starts nothing more on the connection."""

    def __init__(self, raw: asyncio.Transport, close: Callable[[], None]) -> None:
        super().__init__()
        self._transport = raw
        self._on_close = close
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()

    def is_closing(self) -> bool:
        return self._closed or self._transport.is_closing()

    def abort(self) -> None:
        self._closed = True
        self._transport.abort()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class HttpServer(uvicorn.Server):
    """uvicorn, serving on a socket we bound, leaving signal handling to the manager, with the
    listener's limits kept (:class:`HttpLimits`; ``counts`` says what they caught)."""

    counts: HttpCounts

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    @classmethod
    def for_app(
        cls,
        app: ASGIApp,
        limits: HttpLimits | None = None,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> HttpServer:
        """A server for ``app`` within ``limits``; with ``tls`` (a server context), HTTPS only."""
        limits = limits or HttpLimits()
        counts = HttpCounts()
        protocol = type(
            "ManagerHttpProtocol",
            (GuardedHttpProtocol,),
            {"limits": limits, "counts": counts, "tls": tls, "_logged": [float("-inf"), 0.0]},
        )
        config = uvicorn.Config(
            app,
            http=protocol,
            ws="none",  # nothing here speaks WebSocket: no upgrade to another parser
            lifespan="off",
            log_config=None,  # its lines go through the manager's logging, in its format
            access_log=False,
            log_level="warning",
            server_header=False,
            proxy_headers=False,  # the client address is the peer's, whatever a header says
            timeout_keep_alive=limits.keep_alive,
        )
        server = cls(config)
        server.counts = counts
        return server
