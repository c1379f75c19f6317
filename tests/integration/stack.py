"""The real product, started by tests: a manager process, PowerDNS, an origin, a resolving client.

Everything runs on loopback in the test's temporary directory and is stopped by the context
managers even when a test fails. Processes start in their own process groups and are stopped
group-wide, so nothing outlives a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port, http_answers, spawn, stop_group

AGENT_TOKEN = "integration-agent-token-0123456789"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up mid-response are normal under load


class _ThreadedHttp:
    """An ``http.server`` on 127.0.0.1 in a thread: a context manager that starts and stops it."""

    def __init__(self) -> None:
        self.port = free_port()

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _QuietServer(("127.0.0.1", self.port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class Origin(_ThreadedHttp):
    """An origin web server: ``GET /anything?size=N`` answers N bytes, cacheable for a minute."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                origin.hits += 1
                size = 1000
                if "size=" in self.path:
                    size = int(self.path.rsplit("size=", 1)[1].split("&")[0])
                body = b"x" * size
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=60")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class LoadBoard(_ThreadedHttp):
    """The application status endpoint the agents' ``json`` source reads, one per server id.

    ``board.load["s1"] = 90`` makes s1's agent report 90 requests in progress of 100.
    """

    def __init__(self) -> None:
        super().__init__()
        self.load: dict[str, int] = {}
        board = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server = self.path.rsplit("/", 1)[1]
                body = json.dumps(
                    {"in_progress": board.load.get(server, 0), "max_concurrency": 100}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

    def url(self, server: str) -> str:
        return f"http://127.0.0.1:{self.port}/load/{server}"


@dataclass
class ManagerProcess:
    """``dnslb manager`` as a child process with its config, state and plan in ``workdir``."""

    workdir: Path
    config: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    http: str = ""  # more keys of the http block, ", key: value" each

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def plan_path(self) -> Path:
        return self.workdir / "plan.json"

    @property
    def log_path(self) -> Path:
        return self.workdir / "manager.log"

    def start(self, timeout: float = 20.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = self.config + f"\nhttp: {{port: {self.port}{self.http}}}\n"
        (self.workdir / "manager.yaml").write_text(text)
        self.process = spawn(
            [
                sys.executable,
                "-m",
                "cli",
                "manager",
                "--config",
                str(self.workdir / "manager.yaml"),
                "--log-level",
                os.environ.get("DNSLB_TEST_LOG", "info"),
            ],
            name="manager",
            ready=lambda _: http_answers(f"{self.url}/healthz"),
            log=self.log_path,
            timeout=timeout,
            env={**os.environ, "DNSLB_AGENT_TOKEN": AGENT_TOKEN},
        )

    def stop(self) -> int | None:
        """SIGTERM (a clean stop) and wait; returns the exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        stop_group(process, sig=signal.SIGTERM, timeout=30)
        return process.returncode

    def post_report(self, token: str | None, body: bytes) -> int:
        request = urllib.request.Request(f"{self.url}/v1/reports", data=body, method="POST")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def __enter__(self) -> ManagerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_pdns(
    workdir: Path, plan_path: Path, zone: str = "example.test", timeout: float = 30.0
) -> PdnsServer:
    """PowerDNS serving ``plan_path`` once the manager has published it."""
    deadline = time.monotonic() + timeout
    while not plan_path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no plan at {plan_path}")
        time.sleep(0.1)
    server = PdnsServer(PdnsSettings(plan=str(plan_path), port=free_port()), workdir / "pdns")
    server.start(probe_name=zone)
    return server


@dataclass
class Resolver:
    """A stub resolver with a cache that honours TTLs, asking one DNS server."""

    port: int
    cache: dict[tuple[str, str], tuple[float, list[str], int]] = field(default_factory=dict)
    queries: int = 0

    def resolve(self, name: str, rtype: str = "A") -> tuple[list[str], int]:
        now = time.monotonic()
        cached = self.cache.get((name, rtype))
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        return self.ask(name, rtype)

    def ask(self, name: str, rtype: str = "A") -> tuple[list[str], int]:
        """Ask the server (no cache); remembers the answer for its TTL."""
        self.queries += 1
        reply = dns.query.udp(
            dns.message.make_query(name, rtype), "127.0.0.1", port=self.port, timeout=2
        )
        if reply.rcode() != dns.rcode.NOERROR:
            return [], 0
        wanted = dns.rdatatype.from_text(rtype)
        for rrset in reply.answer:
            if rrset.rdtype == wanted:
                addresses = [str(rdata) for rdata in rrset]
                self.cache[(name, rtype)] = (time.monotonic() + rrset.ttl, addresses, rrset.ttl)
                return addresses, rrset.ttl
        return [], 0


def events(manager: ManagerProcess) -> list[dict[str, Any]]:
    """Every event in the manager's state database, oldest first (read directly)."""
    import sqlite3  # noqa: PLC0415

    with sqlite3.connect(manager.workdir / "state.db") as db:
        rows = db.execute(
            "SELECT time, kind, pool, server, reason, from_state, to_state FROM events ORDER BY id"
        ).fetchall()
    names = ("time", "kind", "pool", "server", "reason", "from_state", "to_state")
    return [dict(zip(names, row, strict=True)) for row in rows]


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> float | None:
    """Poll ``predicate`` until true; the seconds it took, or None after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    return None


def tally(counter: Counter[str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(counter.items()))


def iterate_for(seconds: float) -> Iterator[float]:
    """Elapsed seconds, for a loop bounded in time."""
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        yield elapsed
