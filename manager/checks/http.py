"""The ``http`` health check: a server passes when a GET answers with the expected status (and,
if configured, a body containing the expected text)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from dnslb.config import setting
from manager.checks.base import HealthCheck, HealthCheckConfig, register

MAX_BODY = 64 * 1024
"""The most of an answer's body read for ``expect_body``: a health page is short."""


@dataclass(frozen=True, slots=True)
class HttpCheck(HealthCheckConfig):
    """Healthy when an HTTP GET answers with the expected status (and body text)."""

    type: Literal["http"]
    port: int = setting(80, help="port", min=1, max=65535)
    path: str = setting("/", help="path to GET")
    host: str | None = setting(None, help="Host header (default: the check address)")
    expect_status: int = setting(200, help="expected status code", min=100, max=599)
    expect_body: str | None = setting(None, help="text the body must contain")
    interval: float = setting(2.0, help="seconds between checks", min=0.1)
    timeout: float = setting(1.0, help="seconds before a check fails", min=0.05)
    rise: int = setting(2, help="passes in a row to become healthy", min=1)
    fall: int = setting(2, help="failures in a row to become unhealthy", min=1)


@register(HttpCheck)
class HttpHealthCheck(HealthCheck):
    """One HTTP/1.1 GET on a new connection (``Connection: close``)."""

    config: HttpCheck

    async def attempt(self, address: str) -> tuple[bool, str]:
        check = self.config
        reader, writer = await asyncio.open_connection(address, check.port)
        try:
            host = check.host or (f"[{address}]" if ":" in address else address)
            request = (
                f"GET {check.path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: dnslb-health\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(request.encode("ascii"))
            await writer.drain()
            head = await reader.readline()
            parts = head.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                return False, f"not an HTTP response: {head[:60]!r}"
            status = int(parts[1])
            if status != check.expect_status:
                return False, f"HTTP {status}, expected {check.expect_status}"
            if check.expect_body is not None:
                expected = check.expect_body.encode("utf-8")
                # The headers and the body, to the end (Connection: close) or MAX_BODY: one read
                # may return only the first segment of the answer.
                answer = b""
                while expected not in _body(answer) and len(answer) < MAX_BODY:
                    chunk = await reader.read(MAX_BODY - len(answer))
                    if not chunk:
                        break
                    answer += chunk
                if expected not in _body(answer):
                    return False, f"body lacks {check.expect_body!r}"
            return True, ""
        finally:
            writer.close()


def _body(answer: bytes) -> bytes:
    """What follows the headers of an answer read after its status line."""
    return answer.partition(b"\r\n\r\n")[2]
