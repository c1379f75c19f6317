"""Agents' report latency while 200 slow clients hold connections to the manager, side by side.

Run: ``.venv/bin/python -m bench.slow_clients`` (``--quick`` for a shorter run; ``--help``).

A real ``dnslb manager`` (a subprocess, pinned to CPU 0 when ``taskset`` is there; the clients on
the other CPUs) with 100 static servers. 100 agents post a report each per second over their own
keep-alive connection (as ``dnslb agent`` does), and the latency of every report is recorded. The
run alternates rounds of two conditions:

- **quiet**: the agents alone;
- **slowloris**: the agents, and 200 slow clients (a process of their own) kept connected all
  the time: a quarter trickle headers a byte every half second, a quarter send a report's headers
  with a valid token and trickle its body, a quarter make one good request and then trickle the
  next one's headers, a quarter connect and send nothing. A client the manager drops reconnects
  half a second later, so 200 are always trying.

With ``--tls`` the manager serves HTTPS (a CA made for the run): the agents and the first three
kinds of slow clients shake hands first, and the silent ones never say hello (the listener drops
them at its header timeout, the handshake included).

Printed per condition: reports sent and answered 204, p50 / p99 / max latency over every report
of its rounds; for slowloris, how many slow connections were open on average (sampled every
second), how many the manager dropped (it closes them at its header or body timeout) and how long
they lasted. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from daemons.process import free_port, http_answers, spawn
from dnslb.tls import client_context
from evaluation.percentile import percentile
from tests.tls_support import make_pki

TOKEN = "bench-agent-token-0123456789"
SLOW = 200
TRICKLE_EVERY = 0.5
KINDS = ("trickled headers", "trickled body", "stalled keep-alive", "silent")


def write_config(directory: Path, servers: int, port: int, *, tls: bool = False) -> Path:
    """The manager's configuration; with ``tls``, a CA and a certificate made in ``pki/``."""
    members = "\n".join(
        f"      - {{id: s{i}, address: 10.0.{i // 250}.{i % 250 + 1}}}" for i in range(servers)
    )
    http = f"{{port: {port}}}"
    if tls:
        make_pki(directory / "pki")
        http = (
            f"{{port: {port}, tls: {{certificate: file:pki/server.pem, key: file:pki/server.key}}}}"
        )
    path = directory / "manager.yaml"
    path.write_text(
        "zones: [{name: example.test, ns: [ns1.example.test]}]\n"
        "auth: {agent_token: env:DNSLB_BENCH_TOKEN}\n"
        f"http: {http}\n"
        "down_after: 3600\n"
        "pools:\n  - name: www\n    zone: example.test\n    members:\n" + members + "\n"
    )
    return path


@dataclass
class Latencies:
    sent: int = 0
    ok: int = 0
    seconds: list[float] = field(default_factory=list)


@dataclass
class Crowd:
    """The slow clients: how many are open, how many the manager dropped, how long they lived."""

    port: int
    tls: ssl.SSLContext | None = None  # the silent ones never use it: they never say hello
    open_now: int = 0
    dropped: int = 0
    lifetimes: dict[int, list[float]] = field(default_factory=dict)
    samples: list[int] = field(default_factory=list)

    async def one(self, kind: int) -> None:
        """One slow client of the given kind, reconnecting whenever the manager drops it."""
        while True:
            opened = time.monotonic()
            try:
                secure = self.tls if kind != 3 else None
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1",
                    self.port,
                    ssl=secure,
                    server_hostname="127.0.0.1" if secure else None,
                )
            except OSError:
                await asyncio.sleep(0.1)
                continue
            self.open_now += 1
            try:
                await self._hold(kind, reader, writer)
            finally:
                self.open_now -= 1
                writer.close()
            self.dropped += 1
            self.lifetimes.setdefault(kind, []).append(time.monotonic() - opened)
            await asyncio.sleep(TRICKLE_EVERY)  # slow, not a connection flood

    async def _hold(self, kind: int, reader: asyncio.StreamReader, writer: Any) -> None:
        if kind == 0:
            writer.write(b"POST /v1/reports HTTP/1.1\r\nHost: m\r\nX-Slow: ")
        elif kind == 1:
            writer.write(
                b"POST /v1/reports HTTP/1.1\r\nHost: m\r\nContent-Length: 1000\r\n"
                b"Authorization: Bearer " + TOKEN.encode() + b'\r\n\r\n{"server_id": "'
            )
        elif kind == 2:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
            await reader.readuntil(b'"alive"}')
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(65536), TRICKLE_EVERY) == b"":
                        return  # closed by the manager
                except TimeoutError:
                    pass
                if kind != 3:
                    writer.write(b"a")


async def agent(
    url: str,
    server: str,
    until: float,
    latencies: Latencies,
    offset: float,
    verify: ssl.SSLContext | None,
) -> None:
    """One agent: a report a second over its own keep-alive connection, each one timed."""
    seq = int(time.time() * 1000)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        base_url=url, limits=limits, headers=headers, timeout=10, verify=verify or True
    ) as c:
        await asyncio.sleep(offset)
        while time.monotonic() < until:
            seq += 1
            body = {
                "server_id": server,
                "seq": seq,
                "time": time.time(),
                "in_progress": seq % 50,
                "max_concurrency": 100,
            }
            started = time.perf_counter()
            latencies.sent += 1
            try:
                answer = await c.post("/v1/reports", json=body)
                if answer.status_code == 204:
                    latencies.ok += 1
            except httpx.HTTPError:
                pass
            latencies.seconds.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))


def crowd_process(port: int, ca: Path | None, results: Any, stop: Any) -> None:
    """The slow clients, in a process of their own (their work must not slow the agents down)."""

    async def run() -> Crowd:
        crowd = Crowd(port, client_context(ca) if ca else None)
        tasks = [asyncio.create_task(crowd.one(i % len(KINDS))) for i in range(SLOW)]
        while not stop.is_set():
            crowd.samples.append(crowd.open_now)
            await asyncio.sleep(1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return crowd

    crowd = asyncio.run(run())
    results.put((crowd.samples, crowd.dropped, crowd.lifetimes))


async def round_(url: str, agents: int, seconds: float, ca: Path | None) -> Latencies:
    latencies = Latencies()
    until = time.monotonic() + seconds
    verify = client_context(ca) if ca else None
    await asyncio.gather(
        *(agent(url, f"s{i}", until, latencies, i / agents, verify) for i in range(agents))
    )
    return latencies


def measure(
    url: str, port: int, agents: int, seconds: float, slow: bool, ca: Path | None
) -> tuple[Latencies, Crowd]:
    crowd = Crowd(port)
    if not slow:
        return asyncio.run(round_(url, agents, seconds, ca)), crowd
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    stop = context.Event()
    process = context.Process(target=crowd_process, args=(port, ca, results, stop))
    process.start()
    time.sleep(2.0)  # all of them connected before the agents start
    try:
        latencies = asyncio.run(round_(url, agents, seconds, ca))
    finally:
        stop.set()
    crowd.samples, crowd.dropped, crowd.lifetimes = results.get(timeout=60)
    process.join(30)
    return latencies, crowd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each condition")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per round")
    parser.add_argument("--agents", type=int, default=100, help="agents, a report a second each")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 15 s")
    parser.add_argument("--tls", action="store_true", help="the manager serves HTTPS")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 2, 15.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the manager is stopped
    pinned = shutil.which("taskset") is not None and (os.cpu_count() or 1) > 1
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        config = write_config(Path(tmp), args.agents, port, tls=args.tls)
        ca = Path(tmp) / "pki" / "ca.pem" if args.tls else None
        command = [sys.executable, "-m", "cli", "manager", "--config", str(config)]
        command += ["--log-level", "error"]
        if pinned:
            command = ["taskset", "-c", "0", *command]
            os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))
        url = f"{'https' if args.tls else 'http'}://127.0.0.1:{port}"
        verify = client_context(ca) if ca else None

        def ready(_: object) -> bool:
            if verify is None:
                return http_answers(f"{url}/healthz")
            try:
                return httpx.get(f"{url}/healthz", verify=verify, timeout=1).is_success
            except httpx.HTTPError:
                return False

        manager = spawn(
            command,
            name="manager",
            ready=ready,
            log=Path(tmp) / "manager.log",
            timeout=30,
            env={**os.environ, "DNSLB_BENCH_TOKEN": TOKEN},
        )
        try:
            results: dict[str, tuple[Latencies, list[Crowd]]] = {
                "quiet": (Latencies(), []),
                "slowloris": (Latencies(), []),
            }
            for number in range(args.rounds):
                for name in ("quiet", "slowloris"):
                    print(f"round {number + 1}/{args.rounds}: {name}", file=sys.stderr)
                    slow = name == "slowloris"
                    got, crowd = measure(url, port, args.agents, args.seconds, slow, ca)
                    total, crowds = results[name]
                    total.sent += got.sent
                    total.ok += got.ok
                    total.seconds += got.seconds
                    crowds.append(crowd)
        finally:
            os.killpg(manager.pid, signal.SIGTERM)
            manager.wait(20)
    print(
        f"\n{args.agents} agents, a report a second each; {args.rounds} rounds of "
        f"{args.seconds:.0f} s per condition; manager {'on CPU 0' if pinned else 'not pinned'}"
        f"{', over TLS' if args.tls else ''}"
    )
    print(f"{'condition':11} {'sent':>7} {'204':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    p99 = {}
    for name, (total, _) in results.items():
        p50 = percentile(total.seconds, 0.50) * 1000
        p99[name] = percentile(total.seconds, 0.99) * 1000
        print(
            f"{name:11} {total.sent:7d} {total.ok:7d} {p50:8.2f} {p99[name]:8.2f} "
            f"{max(total.seconds) * 1000:8.2f}"
        )
    print(f"p99 slowloris / quiet: {p99['slowloris'] / p99['quiet']:.2f}")
    crowds = results["slowloris"][1]
    held = [sample for crowd in crowds for sample in crowd.samples]
    dropped = sum(crowd.dropped for crowd in crowds)
    print(
        f"slow clients: {statistics.mean(held):.0f} connected on average (of {SLOW} trying), "
        f"{dropped} connections closed by the manager; how long each lasted:"
    )
    for kind, what in enumerate(KINDS):
        lives = [life for crowd in crowds for life in crowd.lifetimes.get(kind, [])]
        if lives:
            print(
                f"  {what:20} {len(lives):6d} closed, after {statistics.median(lives):6.2f} s "
                f"(median), {max(lives):6.2f} s at most"
            )
        else:
            print(f"  {what:20} none closed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
