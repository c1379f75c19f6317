"""Shared by the API tests: a manager with the API attached, driven on a fake clock in process,
or running for real (uvicorn on a free port, agents reporting over HTTP)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cli.main import attach_api
from daemons.process import free_port
from dnslb.clock import FakeClock
from dnslb.model import ServerState
from manager.config import load_manager_config
from manager.control import Control
from manager.providers.memory import MemoryProvider
from manager.service import Manager

ADMIN = "admin-token-0123456789"
READ = "read-token-0123456789"
AGENT = "agent-token-0123456789"

CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth:
  agent_token: file:agent.token
  api_tokens:
    - {token: file:admin.token, role: admin}
    - {token: file:read.token, role: read}
  metrics_public: METRICS_PUBLIC
down_after: 3
tick: TICK
http: {address: 127.0.0.1, port: PORT, cors_origins: CORS}
plan: {refresh: 5, stale_after: 30}
pools:
  - name: www
    zone: example.test
    policy: {k: 2, slow_start: 0, smoothing: 0, th_over: 0.8, hysteresis: 0.1}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
      - {id: s3, address: 10.0.0.3}
  - name: auto
    zone: example.test
    policy: {slow_start: 0, smoothing: 0}
    provider: {type: memory, boot_time: 0, network: 10.99.0}
    scaling:
      {min_servers: 1, max_servers: 3, th_high: 0.7, th_low: 0.3, window: 2,
       scale_in_window: 6, boot_time: 1, max_step: 1, server_capacity: 100}
    lifecycle: {describe_interval: 0.2, drain_timeout: 3}
"""

RUNTIME_POOL: dict[str, Any] = {
    "name": "rt",
    "zone": "example.test",
    "policy": {"k": 1, "slow_start": 0},
    "members": [{"id": "r1", "address": "10.1.0.1"}],
}


def write_config(
    directory: Path,
    *,
    port: int = 8700,
    tick: float = 1.0,
    cors: Sequence[str] = (),
    metrics_public: bool = False,
) -> Path:
    """The test configuration, its token files beside it; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, token in (("admin", ADMIN), ("read", READ), ("agent", AGENT)):
        (directory / f"{name}.token").write_text(token + "\n")
    path = directory / "manager.yaml"
    text = (
        CONFIG.replace("PORT", str(port))
        .replace("TICK", str(tick))
        .replace("CORS", json.dumps(list(cors)))
        .replace("METRICS_PUBLIC", json.dumps(metrics_public))
    )
    path.write_text(text)
    return path


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def reporting_tokens(manager: Manager) -> dict[str, str]:
    """Server id -> the token its agent reports with, for every server that runs."""
    tokens: dict[str, str] = {}
    for server in manager.fleet.servers.values():
        if server.state in (ServerState.LAUNCHING, ServerState.TERMINATED):
            continue
        if server.record.origin == "static":
            tokens[server.id] = AGENT
            continue
        lifecycle = manager.lifecycles.get(server.record.pool)
        provider = lifecycle.provider if lifecycle is not None else None
        if isinstance(provider, MemoryProvider) and server.id in provider.agent_tokens:
            tokens[server.id] = provider.agent_tokens[server.id]
    return tokens


def report_body(server_id: str, seq: int, in_progress: int, served: int) -> bytes:
    body = {
        "server_id": server_id,
        "seq": seq,
        "time": time.time(),
        "in_progress": in_progress,
        "max_concurrency": 100,
        "served_total": served,
    }
    return json.dumps(body).encode()


class ApiLab:
    """A manager on a fake clock with the API attached as ``dnslb manager`` attaches it; agents
    report in process; requests go through the manager's HTTP front over httpx's ASGI transport.
    Build it inside a running event loop."""

    def __init__(
        self, directory: Path, *, cors: Sequence[str] = (), metrics_public: bool = False
    ) -> None:
        self.path = write_config(directory, cors=cors, metrics_public=metrics_public)
        self.clock = FakeClock()
        self.seq = 1000
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)
        self.control = Control(self.manager)
        attach_api(self.manager)
        self.app = self.manager.http_app()

    def client(self, token: str | None = ADMIN) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://dnslb.test",
            headers=bearer(token),
        )

    async def step(self, load: int | Callable[[str], int] = 10, seconds: int = 1) -> None:
        """``seconds`` ticks; every running server reports ``load`` of 100 before each."""
        for _ in range(seconds):
            self.seq += 1
            for server_id, token in reporting_tokens(self.manager).items():
                value = load(server_id) if callable(load) else load
                body = report_body(server_id, self.seq, value, self.seq - 1000)
                self.manager.ingest.accept(token, body)
            self.clock.advance(1)
            self.manager.tick()
            await self.manager.settle()

    async def ready(self, load: int = 10) -> None:
        """Step until the manager publishes its first plan (every server has reported)."""
        for _ in range(10):
            await self.step(load)
            if self.manager.plan is not None:
                return
        raise AssertionError("the manager published no plan in 10 ticks")

    async def close(self) -> None:
        await self.manager.close()


def wave(server_id: str, now: float) -> int:
    """A load that moves: each server on its own phase, now and then above th_over."""
    phase = sum(map(ord, server_id)) % 7
    return max(0, min(100, int(55 + 40 * math.sin(now / 4 + phase))))


class RunningManager:
    """``Manager.run()`` with the API on a free port in a thread of its own, and agents posting
    reports to it over HTTP (``load(server_id, now)`` of 100) every ``every`` seconds."""

    def __init__(
        self,
        directory: Path,
        *,
        load: Callable[[str, float], int] = wave,
        every: float = 0.25,
        tick: float = 0.25,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.path = write_config(directory, port=self.port, tick=tick)
        self.load = load
        self.every = every
        self.failure: BaseException | None = None
        self.reports = 0
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="manager", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the test thread, which fails with it
            self.failure = exc

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        manager = Manager(load_manager_config(self.path))
        attach_api(manager)
        self.manager = manager
        running = asyncio.create_task(manager.run(self._stop))
        feeding = asyncio.create_task(self._feed(manager))
        await running
        feeding.cancel()

    async def _feed(self, manager: Manager) -> None:
        seq = 0
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:
            while True:
                seq += 1
                for server_id, token in reporting_tokens(manager).items():
                    body = report_body(server_id, seq, self.load(server_id, time.time()), seq * 7)
                    try:
                        answer = await client.post(
                            "/v1/reports", content=body, headers=bearer(token)
                        )
                    except httpx.TransportError:
                        continue  # the manager is stopping
                    if answer.status_code == 204:
                        self.reports += 1
                await asyncio.sleep(self.every)

    def start(self) -> RunningManager:
        self._thread.start()
        wait_for(self._ready, what="the manager to publish a plan", timeout=30)
        return self

    def _ready(self) -> bool:
        if self.failure is not None:
            raise self.failure
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
        if self.failure is not None:
            raise self.failure


@contextmanager
def running_manager(directory: Path, **options: Any) -> Iterator[RunningManager]:
    manager = RunningManager(directory, **options).start()
    try:
        yield manager
    finally:
        manager.stop()


def wait_for(condition: Callable[[], bool], *, what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
