"""The health checks against real servers on loopback, and rise/fall counting."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from manager.checks import HttpCheck, TcpCheck, create_check
from manager.fleet import CheckStatus
from manager.health import count_result

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def probe_served(check: TcpCheck | HttpCheck, handler: Handler) -> tuple[bool, str]:
    """Probe 127.0.0.1 with ``check`` while ``handler`` serves its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await create_check(_with_port(check, port)).probe("127.0.0.1")


def _with_port(check: TcpCheck | HttpCheck, port: int) -> TcpCheck | HttpCheck:
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(check, port=port)


def answering(reply: bytes, *, read_request: bool = True) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if read_request:
                await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        finally:
            writer.close()

    return handle


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read()  # until the check gives up and closes
    finally:
        writer.close()


def test_tcp_passes_when_a_connection_opens() -> None:
    result = asyncio.run(
        probe_served(TcpCheck(type="tcp", port=1), answering(b"", read_request=False))
    )
    assert result == (True, "")


def test_tcp_fails_with_the_reason_when_nothing_listens() -> None:
    check = create_check(TcpCheck(type="tcp", port=closed_port()))
    ok, why = asyncio.run(check.probe("127.0.0.1"))
    assert not ok and why  # "Connect call failed" or "Connection refused", the OS's words


HEALTHY = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nhealthy"


@pytest.mark.parametrize(
    ("check", "reply", "expected"),
    [
        pytest.param(HttpCheck(type="http"), HEALTHY, (True, ""), id="status"),
        pytest.param(HttpCheck(type="http", expect_body="healthy"), HEALTHY, (True, ""), id="body"),
        pytest.param(
            HttpCheck(type="http", expect_status=204),
            HEALTHY,
            (False, "HTTP 200, expected 204"),
            id="wrong-status",
        ),
        pytest.param(
            HttpCheck(type="http", expect_body="ready"),
            HEALTHY,
            (False, "body lacks 'ready'"),
            id="body-lacks-text",
        ),
        pytest.param(
            HttpCheck(type="http"),
            b"SSH-2.0-OpenSSH_9.2\r\n",
            (False, "not an HTTP response: b'SSH-2.0-OpenSSH_9.2\\r\\n'"),
            id="not-http",
        ),
    ],
)
def test_http_checks_the_status_and_the_body(
    check: HttpCheck, reply: bytes, expected: tuple[bool, str]
) -> None:
    assert asyncio.run(probe_served(check, answering(reply))) == expected


def test_http_sends_the_path_and_the_host() -> None:
    seen: list[bytes] = []

    async def recording(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(HEALTHY)
        finally:
            writer.close()

    check = HttpCheck(type="http", path="/health?deep=1", host="www.example.test")
    assert asyncio.run(probe_served(check, recording)) == (True, "")
    assert seen[0].startswith(b"GET /health?deep=1 HTTP/1.1\r\nHost: www.example.test\r\n")


def test_http_reads_a_body_that_comes_after_the_headers() -> None:
    async def slow_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nX-State: ready\r\nConnection: close\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"ready")
        finally:
            writer.close()

    check = HttpCheck(type="http", expect_body="ready")
    assert asyncio.run(probe_served(check, slow_body)) == (True, "")


def test_http_looks_for_the_text_in_the_body_not_the_headers() -> None:
    reply = b"HTTP/1.1 200 OK\r\nX-State: ready\r\nConnection: close\r\n\r\nstarting"
    check = HttpCheck(type="http", expect_body="ready")
    assert asyncio.run(probe_served(check, answering(reply))) == (False, "body lacks 'ready'")


def test_a_server_that_never_answers_fails_at_the_timeout() -> None:
    check = HttpCheck(type="http", timeout=0.1)
    assert asyncio.run(probe_served(check, silent)) == (False, "timed out after 0.1 s")


def test_rise_and_fall_turn_the_verdict() -> None:
    status = CheckStatus()
    verdicts = []
    for ok in (True, True, False, True, False, False):
        changed = count_result(status, ok, "" if ok else "down", rise=2, fall=2)
        verdicts.append((status.healthy, changed))
    assert verdicts == [
        (None, False),
        (True, True),
        (True, False),
        (True, False),
        (True, False),
        (False, True),
    ]
    assert status.last_error == "down"
