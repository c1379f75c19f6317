"""The manager's listener holds its ground: uvicorn with the guard of :mod:`manager.http`, on a
loopback port, with short limits, against clients that are slow or greedy on purpose. Every test
checks an outcome (closed, answered, counted); waits are generous bounds, never measurements."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from manager.http import HttpLimits, HttpServer, listen

LIMITS = HttpLimits(
    header_timeout=0.5,
    body_timeout=0.5,
    write_timeout=0.5,
    keep_alive=1,
    max_connections=8,
    max_header_bytes=4096,
)
BIG = 8 * 1024 * 1024  # an answer far larger than any socket buffer


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body; ``/big`` answers 8 MiB, ``/early`` answers before reading its body
    (as a refused token is), anything else the body's length."""
    assert scope["type"] == "http"
    if scope["path"] == "/early":
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/refuse":  # as the API refuses a token: answered, then closed
        headers = [(b"content-length", b"6"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": b"denied"})
        return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    payload = b"x" * BIG if scope["path"] == "/big" else str(size).encode()
    headers = [(b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class Listener:
    """HttpServer.for_app(app, limits, tls=tls) on a free loopback port, in a thread of its own."""

    def __init__(self, limits: HttpLimits = LIMITS, tls: ssl.SSLContext | None = None) -> None:
        self.sock = listen("127.0.0.1", 0)
        self.port = int(self.sock.getsockname()[1])
        self.server = HttpServer.for_app(app, limits, tls=tls)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clients: list[socket.socket] = []
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        wait(lambda: self.server.started, "the listener to start")

    def _main(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        asyncio.run(serve())

    def connect(self, receive_buffer: int | None = None) -> socket.socket:
        client = socket.socket()
        self.clients.append(client)
        if receive_buffer is not None:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        client.settimeout(10)
        client.connect(("127.0.0.1", self.port))
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    running = Listener()
    try:
        yield running
    finally:
        running.stop()


def wait(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def closed_by_server(client: socket.socket, timeout: float = 15.0) -> bytes:
    """Everything the server sent until it closed the connection (fails if it never does)."""
    client.settimeout(timeout)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := client.recv(65536):
            received += chunk
    return received


def request(client: socket.socket, path: str = "/", body: bytes = b"") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    client.sendall(head.encode() + body)
    client.settimeout(10)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(str(len(body)).encode()):
        chunk = client.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_headers_trickled_byte_by_byte_are_cut_off(listener: Listener) -> None:
    client = listener.connect()
    sent = 0
    with contextlib.suppress(OSError):
        for byte in b"POST / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 10_000:
            client.send(bytes([byte]))
            sent += 1
            time.sleep(0.01)
    assert closed_by_server(client) == b""
    assert sent < 10_000  # cut off long before the client was done
    assert listener.server.counts.slow_headers == 1


def test_a_body_never_finished_is_cut_off(listener: Listener) -> None:
    client = listener.connect()
    client.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
    assert closed_by_server(client) == b""
    assert listener.server.counts.slow_bodies == 1


def test_a_kept_alive_connection_gets_no_slack_for_its_next_request(listener: Listener) -> None:
    client = listener.connect()
    assert request(client, body=b"hello").endswith(b"5")
    client.sendall(b"GET / HTTP/1.1\r\n")  # and never the rest
    assert closed_by_server(client) == b""
    assert listener.server.counts.slow_headers == 1


def test_a_next_request_begun_with_the_last_one_gets_no_slack(listener: Listener) -> None:
    client = listener.connect()
    client.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n")
    answer = b""
    while not answer.endswith(b"\r\n\r\n2"):
        answer += client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 ")  # the first one answered
    with contextlib.suppress(OSError):
        for _ in range(1000):  # and the second one trickled after it
            client.send(b"X")
            time.sleep(0.01)
    assert closed_by_server(client) == b""
    assert listener.server.counts.slow_headers == 1  # dropped at its headers' deadline


def test_a_body_finished_after_an_early_answer_leaves_no_idle_connection(
    listener: Listener,
) -> None:
    client = listener.connect()
    client.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n"):  # its headers and its (empty) chunked body
        answer += client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401 ")
    client.sendall(b"hello")  # the rest of the body, then nothing: an idle connection
    assert closed_by_server(client) == b""  # closed at the keep-alive timeout


def _refused_before_its_body(listener: Listener, length: int) -> socket.socket:
    client = listener.connect()
    client.sendall(f"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"denied"):
        answer += client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403 ")
    return client


def test_a_body_sent_after_a_refusal_and_close_is_read_not_reset(listener: Listener) -> None:
    # The client's body goes out after the server has answered and closed: a server that closed
    # for real makes the kernel answer it with a reset, and a client still writing its body (as
    # httpx does) fails with "connection reset" instead of reading the 403. A lingering close
    # takes the body and ends the connection cleanly.
    client = _refused_before_its_body(listener, 100_000)
    time.sleep(0.2)  # the server has closed its side by now
    client.sendall(b"x" * 50_000)
    time.sleep(0.2)  # a reset, were there one, has arrived
    client.sendall(b"x" * 50_000)  # raises ConnectionResetError (or BrokenPipeError) after one
    client.settimeout(10)
    assert client.recv(4096) == b""  # the end of the answer
    client.close()
    wait(lambda: not listener.server.server_state.connections, "the connection to be gone")
    assert listener.server.counts.long_lingers == 0


def test_a_refused_body_that_keeps_coming_is_cut_off(listener: Listener) -> None:
    client = _refused_before_its_body(listener, 1 << 30)
    sent = 0
    with contextlib.suppress(OSError):
        while sent < 64 * 1024 * 1024:
            client.sendall(b"x" * 65536)
            sent += 65536
    assert sent < 64 * 1024 * 1024  # cut off long before
    wait(lambda: listener.server.counts.long_lingers == 1, "the lingering connection cut")


def test_blank_lines_between_requests_do_not_hold_a_connection(listener: Listener) -> None:
    client = listener.connect()
    with contextlib.suppress(OSError):
        for _ in range(1000):
            client.send(b"\r\n")
            time.sleep(0.01)
    assert closed_by_server(client) == b""


def test_headers_over_the_cap_get_431(listener: Listener) -> None:
    client = listener.connect()
    with contextlib.suppress(OSError):
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    assert closed_by_server(client).startswith(b"HTTP/1.1 431 ")
    assert listener.server.counts.large_headers == 1


def test_a_header_that_never_ends_gets_431(listener: Listener) -> None:
    client = listener.connect()
    with contextlib.suppress(OSError):
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20_000)
    assert closed_by_server(client).startswith(b"HTTP/1.1 431 ")
    assert listener.server.counts.large_headers == 1


def test_junk_is_refused_and_logged_once_not_once_per_client(
    listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for _ in range(50):
        client = listener.connect()
        client.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert closed_by_server(client).startswith(b"HTTP/1.1 400 ")
    assert listener.server.counts.malformed == 50
    assert len(caplog.records) == 1
    assert "closed 1 connection(s)" in caplog.records[0].getMessage()


def test_connections_over_the_cap_are_closed_as_they_come(listener: Listener) -> None:
    held = [listener.connect() for _ in range(LIMITS.max_connections)]
    wait(
        lambda: len(listener.server.server_state.connections) == LIMITS.max_connections,
        "the listener to hold its connections",
    )
    extra = listener.connect()
    assert closed_by_server(extra) == b""
    assert listener.server.counts.over_capacity == 1
    for client in held:
        client.close()
    wait(lambda: not listener.server.server_state.connections, "the held connections to go")
    assert request(listener.connect(), body=b"again").endswith(b"5")


def test_a_client_that_does_not_read_its_answer_is_cut_off(listener: Listener) -> None:
    client = listener.connect(receive_buffer=4096)
    client.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
    wait(lambda: listener.server.counts.slow_readers == 1, "the slow reader to be dropped")
    assert len(closed_by_server(client)) < BIG


def test_a_good_client_is_answered_while_slow_ones_are_held(listener: Listener) -> None:
    slow = [listener.connect() for _ in range(LIMITS.max_connections - 2)]
    for client in slow:
        client.sendall(b"POST / HTTP/1.1\r\nHost: t\r\n")
    assert request(listener.connect(), body=b"report").endswith(b"6")
    for client in slow:
        assert closed_by_server(client) == b""
    assert listener.server.counts.slow_headers == len(slow)
