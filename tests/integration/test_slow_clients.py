"""The manager's real listener (``Manager.run``: uvicorn on a loopback port, agents reporting over
HTTP) against 200 clients that are slow on purpose: headers trickled a byte at a time, bodies never
finished, a kept-alive connection that starts a request and stalls, bodies sent with a token that
is not valid. Every one of them is closed by the manager with its default limits, while real
agents' reports keep being accepted."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.api_support import AGENT, bearer, report_body, running_manager, wait_for

pytestmark = pytest.mark.integration

KINDS = {  # kind -> how many of the 200
    "headers": 60,  # headers trickled, never ended
    "body": 60,  # valid agent token, body trickled, never finished
    "keepalive": 40,  # one good request, then the next one's first line, trickled
    "bad-token": 40,  # a token nobody holds, with a body on its way
}
TRICKLE_EVERY = 0.5  # seconds between the bytes a slow client sends


@dataclass
class SlowClient:
    kind: str
    sock: socket.socket
    opened: float
    closed: float | None = None
    answer: bytes = b""
    sent: int = 0

    def trickle(self) -> None:
        """One more byte of whatever it is sending; notices when the server has closed."""
        self.poll()
        if self.closed is not None:
            return
        try:
            self.sock.send(b"a")
            self.sent += 1
        except OSError:
            self.closed = time.monotonic()

    def poll(self) -> None:
        if self.closed is not None:
            return
        try:
            while chunk := self.sock.recv(65536):
                self.answer += chunk
            self.closed = time.monotonic()
        except BlockingIOError:
            return
        except OSError:
            self.closed = time.monotonic()


@dataclass
class SlowCrowd:
    """200 slow clients of a listener, each sending a byte every TRICKLE_EVERY seconds."""

    port: int
    clients: list[SlowClient] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def open(self) -> None:
        for kind, count in KINDS.items():
            for _ in range(count):
                self.clients.append(self._open(kind))
        threading.Thread(target=self._trickle, daemon=True).start()

    def _open(self, kind: str) -> SlowClient:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        if kind == "headers":
            sock.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: manager\r\nX-Slow: ")
        elif kind == "body":
            sock.sendall(
                b"POST /v1/reports HTTP/1.1\r\nHost: manager\r\nContent-Length: 1000\r\n"
                b"Authorization: Bearer " + AGENT.encode() + b'\r\n\r\n{"server_id": "'
            )
        elif kind == "keepalive":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: manager\r\n\r\n")
            answer = b""
            while not answer.endswith(b'"alive"}'):
                answer += sock.recv(4096)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        else:
            sock.sendall(
                b"POST /v1/reports HTTP/1.1\r\nHost: manager\r\nContent-Length: 1000\r\n"
                b"Authorization: Bearer not-a-token\r\n\r\n{"
            )
        sock.setblocking(False)
        return SlowClient(kind, sock, time.monotonic())

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_EVERY):
            for client in self.clients:
                client.trickle()

    def held(self) -> int:
        for client in self.clients:
            client.poll()
        return sum(1 for client in self.clients if client.closed is None)

    def close(self) -> None:
        self._stop.set()
        for client in self.clients:
            client.sock.close()


def test_slow_clients_are_dropped_while_agents_are_answered(tmp_path: Path) -> None:
    with running_manager(tmp_path) as manager, contextlib.closing(SlowCrowd(manager.port)) as crowd:
        crowd.open()
        # Real reports while the crowd is held: each one answered, and the crowd still there.
        held_at_answers = []
        with httpx.Client(base_url=manager.url, timeout=10) as agent:
            for seq in range(10):
                answer = agent.post(
                    "/v1/reports",
                    content=report_body("s1", 10**9 + seq, 10, seq),
                    headers=bearer(AGENT),
                )
                assert answer.status_code == 204, answer.text
                held_at_answers.append(crowd.held())
        fed_before = manager.reports
        wait_for(lambda: crowd.held() == 0, what="every slow client to be dropped", timeout=60)
        assert manager.reports > fed_before  # the agents' own loop went on meanwhile

    assert max(held_at_answers) >= len(crowd.clients) - KINDS["bad-token"]
    for client in crowd.clients:
        assert client.closed is not None
        if client.kind == "bad-token":
            # Refused from its headers, its body never read: 401 and the connection closed.
            assert client.answer.startswith(b"HTTP/1.1 401 "), client.answer
            assert b"connection: close" in client.answer
        else:
            # Dropped by the manager (these clients never stop on their own), with no answer.
            assert client.answer == b"", (client.kind, client.answer)
