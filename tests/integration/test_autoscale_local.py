"""Autoscaling with the local provider, end to end: real nginx cache servers are launched under
load, appear in DNS answers, are drained and terminated when load drops, and clients that resolve
through pdns and honour TTLs never fail a request."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from daemons.process import free_port
from tests.integration.stack import (
    ManagerProcess,
    Origin,
    Resolver,
    events,
    start_pdns,
    tally,
    wait_until,
)

pytestmark = pytest.mark.integration

NETWORK = "127.0.3"


def config(origin: str, port: int) -> str:
    return f"""
zones: [{{name: example.test, ns: [ns1.example.test]}}]
down_after: 3
tick: 0.5
plan: {{refresh: 1, stale_after: 30}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 2, ttl_max: 4, ttl_min: 1, th_over: 0.9, hysteresis: 0.1, slow_start: 2,
              smoothing: 1}}
    provider:
      type: local
      origin: {origin}
      network: {NETWORK}
      port: {port}
      boot_delay: 1
      max_concurrency: 4
      capacity_rps: 8
      report_interval: 0.5
    scaling: {{min_servers: 1, max_servers: 3, th_high: 0.6, th_low: 0.25, window: 3,
               scale_in_window: 8, boot_time: 2, max_step: 2}}
    lifecycle: {{warming_timeout: 30, drain_timeout: 30, describe_interval: 0.5}}
"""


class Clients:
    """Client threads resolving through pdns (honouring TTLs), fetching from the first address."""

    def __init__(self, dns_port: int, http_port: int) -> None:
        self.dns_port = dns_port
        self.http_port = http_port
        self.outcomes: Counter[str] = Counter()
        self.addresses: Counter[str] = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads: list[tuple[threading.Thread, threading.Event]] = []

    def run(self, stop: threading.Event) -> None:
        resolver = Resolver(self.dns_port)
        while not stop.is_set():
            addresses, _ = resolver.resolve("www.example.test")
            if not addresses:
                with self.lock:
                    self.outcomes["no_answer"] += 1
                time.sleep(0.2)
                continue
            address = addresses[0]
            url = f"http://{address}:{self.http_port}/object?size=20000"
            try:
                with urllib.request.urlopen(url, timeout=15) as response:
                    response.read()
                    outcome = "ok" if response.status == 200 else f"http_{response.status}"
            except OSError as exc:
                outcome = "failed"
                with self.lock:
                    self.failures.append(f"{address}: {exc}")
            with self.lock:
                self.outcomes[outcome] += 1
                self.addresses[address] += 1

    def scale_to(self, count: int) -> None:
        while len(self.threads) < count:
            stop = threading.Event()
            thread = threading.Thread(target=self.run, args=(stop,), daemon=True)
            thread.start()
            self.threads.append((thread, stop))
        while len(self.threads) > count:
            thread, stop = self.threads.pop()
            stop.set()
            thread.join(20)

    def stop(self) -> None:
        self.scale_to(0)


def nginx_processes_under(directory: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(directory).encode() in command:
                found.append(int(entry.name))
    return found


def wait_for_event(manager: ManagerProcess, predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(predicate(e) for e in events(manager)):  # type: ignore[operator]
            return True
        time.sleep(0.25)
    return False


def test_scale_out_and_in_with_no_failed_request(tmp_path: Path) -> None:
    http_port = free_port()
    with Origin() as origin:
        manager = ManagerProcess(tmp_path / "manager", config(origin.url, http_port))
        manager.start()
        pdns = None
        clients = None
        try:
            pdns = start_pdns(tmp_path, manager.plan_path)
            clients = Clients(pdns.settings.port, http_port)
            # Wait for the first server (min_servers) to serve, and to be in the answers. (Until
            # then the pool is empty: pdns caches that for negquery-cache-ttl, 5 s.)
            assert wait_for_event(manager, lambda e: "warming -> active" in change(e), 30)
            probe = Resolver(pdns.settings.port)
            assert wait_until(lambda: all(probe.ask("www.example.test")[0] for _ in range(5)), 15)
            clients.scale_to(10)  # 10 closed-loop clients, 8 requests/s: they queue, u ~ 10/4
            launched = wait_for_event(manager, lambda e: e["kind"] == "scale_out", 30)
            assert launched
            # Generous: a second nginx and agent start, boot and report on a machine that may be
            # busy (it returns as soon as the server is active).
            grown = wait_for_event(
                manager,
                lambda e: "warming -> active" in change(e) and e["server"] != first_server(manager),
                90,
            )
            assert grown, (
                f"no second server; clients: {tally(clients.outcomes)} {clients.failures[:3]}; "
                "events: " + "; ".join(f"{e['server']} {change(e)}" for e in events(manager))
            )
            time.sleep(6)  # load spreads over the new servers
            served_by = set(clients.addresses)
            clients.scale_to(1)  # load drops: a server is drained, then terminated
            drained = wait_for_event(manager, lambda e: "active -> draining" in change(e), 40)
            terminated = wait_for_event(
                manager, lambda e: "draining -> terminated" in change(e), 40
            )
            clients.stop()
            print(
                f"client outcomes: {tally(clients.outcomes)}; by address: {dict(clients.addresses)}"
            )
            print(
                "events:\n"
                + "\n".join(
                    f"  {e['kind']:<12} {e['server']}: {e['reason']}" for e in events(manager)
                )
            )
            assert drained and terminated
            assert len(served_by) >= 2, "the launched server never appeared in answers"
            assert all(address.startswith(f"{NETWORK}.") for address in served_by)
            assert clients.outcomes["ok"] > 50
            assert clients.failures == [], clients.failures[:5]
            assert set(clients.outcomes) == {"ok"}
        finally:
            if clients is not None:
                clients.stop()
            if pdns is not None:
                pdns.stop()
            assert manager.stop() == 0
    providers = tmp_path / "manager" / "providers"
    assert nginx_processes_under(providers) == []  # stopped with the manager: nothing orphaned
    assert any("stopped with the manager" in e["reason"] for e in events(manager))


def first_server(manager: ManagerProcess) -> str | None:
    for event in events(manager):
        if "warming -> active" in change(event):
            return str(event["server"])
    return None


def change(event: dict[str, Any]) -> str:
    """An event as ``from -> to: reason`` (a state change) or its reason."""
    if event.get("to_state") is None:
        return str(event["reason"])
    return f"{event['from_state']} -> {event['to_state']}: {event['reason']}"
