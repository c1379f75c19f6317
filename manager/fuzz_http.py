"""Fuzz harness for the manager's listener: raw bytes from anyone who can reach its port.

One manager (static members, a fake clock, its state in a temporary directory) serves its HTTP
front (:class:`~manager.http.ManagerApp`: reports, ``/healthz``, ``/readyz``) through
:class:`~manager.http.HttpServer` on a loopback port, with the listener's guard at short limits.
Each input is a connection carrying requests as agents and strangers might send them (reports
with the shared token, another's or none; health checks; pipelined requests; declared lengths
that lie), mutated byte by byte (flipped, cut, repeated, separators and NULs inserted), sent in
random pieces; sometimes the client stops sending and waits for the listener to give up on it.

Contract checked per input: every answer on the connection is a well-formed HTTP/1.1 status line
below 500; the connection ends (answered and closed, or dropped by the guard within its limits);
nothing is logged with a traceback (the engine counts that as a crash); and the listener still
answers ``GET /healthz`` on a fresh connection afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from dnslb.clock import FakeClock
from dnslb.fuzzing import Finding, Harness, hostile_text, mutate_bytes
from manager.config import load_manager_config
from manager.http import HttpLimits, HttpServer, listen
from manager.service import Manager

TOKEN, OWN_TOKEN = (secrets.token_urlsafe(18) for _ in range(2))

_CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_FUZZ_HTTP_AGENT_TOKEN}
down_after: 3
pools:
  - name: www
    zone: example.test
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2, token: env:DNSLB_FUZZ_HTTP_OWN_TOKEN}
"""

LIMITS = HttpLimits(
    header_timeout=0.2,
    body_timeout=0.2,
    write_timeout=0.5,
    keep_alive=1,
    max_connections=64,
    max_header_bytes=8192,
)
_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


class HttpHarness(Harness):
    name = "http"
    boundary = "raw HTTP/1.1 bytes to the manager's listener (anyone who can reach its port)"
    deadline = 10.0  # a patient input waits up to 4 s for the guard (a loaded machine is slow)
    suite_inputs = 250

    def open(self) -> None:
        os.environ["DNSLB_FUZZ_HTTP_AGENT_TOKEN"] = TOKEN
        os.environ["DNSLB_FUZZ_HTTP_OWN_TOKEN"] = OWN_TOKEN
        self.directory = Path(tempfile.mkdtemp(prefix="dnslb-fuzz-http-"))
        (self.directory / "manager.yaml").write_text(_CONFIG)
        self.sock = listen("127.0.0.1", 0)
        self.port = int(self.sock.getsockname()[1])
        self.seq = 0
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="fuzz-http", daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError(f"the listener did not start: {self.failure!r}")

    def _serve(self) -> None:
        async def serve() -> None:
            # The manager's SQLite connection belongs to the thread that serves it.
            self.manager = Manager(
                load_manager_config(self.directory / "manager.yaml"), clock=FakeClock()
            )
            self.server = HttpServer.for_app(self.manager.http_app(), LIMITS)
            serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))
            while not self.server.started:
                await asyncio.sleep(0.01)
            self.ready.set()
            await serving
            self.manager.store.close()

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by open() or close()
            self.failure = exc

    def close(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def one(self, rng: random.Random) -> str:
        data = b"".join(self._request(rng) for _ in range(rng.choice((1, 1, 1, 2, 3))))
        if rng.random() < 0.8:
            data = mutate_bytes(data, rng, mutations=rng.choice((1, 2, 4)))
        patient = rng.random() < 0.1  # wait for the guard to give up on an unfinished request
        answer = self._exchange(data, rng, patient=patient)
        statuses = [int(code) for code in _STATUS.findall(answer)]
        if answer and not answer.startswith(b"HTTP/1.1 "):
            raise Finding(f"not an HTTP answer: {answer[:80]!r}")
        # 503 is /readyz's answer (no plan published yet, as meant): nothing else sends it.
        if any(status >= 500 and status != 503 for status in statuses):
            raise Finding(f"a server error for {data[:200]!r}: {answer[:300]!r}")
        health = b"GET /healthz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n"
        if self._exchange(health, rng, closes=True)[:12] != b"HTTP/1.1 200":
            raise Finding("the listener stopped answering /healthz")
        if not statuses:
            return "dropped"
        return "not-ready" if statuses[-1] == 503 else f"{statuses[-1] // 100}xx"

    def _request(self, rng: random.Random) -> bytes:
        kind = rng.random()
        if kind < 0.15:
            return b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n"
        if kind < 0.2:
            return b"GET /readyz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n"
        if kind < 0.25:
            path = hostile_text(rng).encode("utf-8", "surrogatepass")[:200]
            return b"GET /" + path + b" HTTP/1.1\r\nHost: m\r\n\r\n"
        self.seq += 1
        server = rng.choice(("s1", "s1", "s2", "nobody", hostile_text(rng)))
        report = {
            "server_id": server,
            "seq": self.seq,
            "time": 1.0,
            "in_progress": rng.choice((0, 5, 10**9)),
            "max_concurrency": 100,
        }
        body = json.dumps(report).encode("utf-8", "surrogatepass")
        token = rng.choice((TOKEN, TOKEN, OWN_TOKEN, "wrong", ""))
        length = len(body) if rng.random() < 0.9 else rng.choice((0, len(body) + 5, 10**6))
        head = [
            b"POST /v1/reports HTTP/1.1",
            b"Host: m",
            b"Content-Type: application/json",
            b"Authorization: Bearer " + token.encode(),
            b"Content-Length: " + str(length).encode(),
        ]
        if rng.random() < 0.2:
            head.append(b"Connection: close")
        if rng.random() < 0.1:
            head.append(b"Expect: 100-continue")
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def _exchange(
        self, data: bytes, rng: random.Random, *, patient: bool = False, closes: bool = False
    ) -> bytes:
        """Send ``data`` in random pieces; what came back before the connection ended. Unless
        ``patient`` (waiting for the guard to drop an unfinished request) or ``closes`` (the
        server will close: the request says so), the wait ends after 20 ms without a byte once
        everything was sent: a later answer is not checked, only missed."""
        client = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        answer = b""
        try:
            cuts = sorted(rng.sample(range(1, max(2, len(data))), k=min(3, max(0, len(data) - 2))))
            pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            for piece in pieces:
                try:
                    client.sendall(piece)
                except OSError:
                    break  # dropped by the guard, or closed after an answer
            # Patient: well past keep-alive (an answered connection is closed then) and the
            # read timeouts (an unfinished one is dropped then), within the input's deadline.
            client.settimeout(4.0 if patient or closes else 0.02)
            ends = time.monotonic() + 4.0
            while time.monotonic() < ends:
                try:
                    chunk = client.recv(65536)
                except TimeoutError:
                    if patient:
                        raise Finding("the guard kept an unfinished request open") from None
                    break
                except OSError:
                    break  # reset: dropped
                if not chunk:
                    break
                answer += chunk
        finally:
            client.close()
        return answer


__all__ = ["HttpHarness"]
