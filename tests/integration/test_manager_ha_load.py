"""kill -9 of the leading manager while it scales a pool out, under client load: two real
manager processes on one real PostgreSQL, publishing to one real Redis that a real pdns_server
reads; real local cache servers (nginx and an agent each); users that resolve through that pdns
(keeping each answer for its TTL) and fetch from the first address, before, during and after the
takeover.

What must hold: no user request fails (the servers keep serving while the managers change, and
DNS only ever hands out serving ones), the standby leads and publishes, no server is launched
twice and none is left running unknown. The seconds to lead and publish, and the users'
requests, are printed, not asserted.
"""

from __future__ import annotations

import http.client
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port
from dnslb.errors import PlanError
from dnslb.plan_store import PlanStore, open_store
from tests.integration.postgres import postgres_cluster
from tests.integration.stack import Origin, Resolver
from tests.integration.test_manager_ha import (
    SERVERS,
    _first,
    kill_the_leader,
    lab_processes,
    lead_then_stand_by,
    manager_in,
    peers,
    recorded_pids,
    server_dirs,
    servers,
    shared,  # noqa: F401 (a fixture)
)
from tests.integration.test_redis_store import Redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("redis-server") is None, reason="redis-server is not installed"
    ),
]

NAME = "www.example.test"
USERS = 4
MAX_REQUESTS = 5000  # per user: the load is bounded in count as well as in time


@dataclass
class Users:
    """``USERS`` threads, each resolving through pdns with a TTL-honouring cache of its own,
    fetching from the first address, pausing 20 ms between requests, until stopped."""

    dns_port: int
    http_port: int
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for number in range(USERS):
            thread = threading.Thread(target=self._user, name=f"user-{number}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _note(self, outcome: str, detail: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if detail is not None and len(self.failures) < 20:
                self.failures.append(detail)

    def _user(self) -> None:
        resolver = Resolver(self.dns_port)
        for _ in range(MAX_REQUESTS):
            if self.stop.is_set():
                return
            try:
                addresses, _ = resolver.resolve(NAME)
            except Exception as exc:  # a DNS timeout is an outcome here
                self._note("dns failed", f"dns: {type(exc).__name__}: {exc}")
                time.sleep(0.02)
                continue
            if not addresses:
                self._note("no address")
                time.sleep(0.02)
                continue
            address = addresses[0]
            connection = http.client.HTTPConnection(address, self.http_port, timeout=10)
            try:
                connection.request("GET", "/object?size=8000", headers={"Host": NAME})
                response = connection.getresponse()
                response.read()
                if response.status == 200:
                    self._note("ok")
                else:
                    self._note("failed", f"{address}: HTTP {response.status}")
            except OSError as exc:
                self._note("failed", f"{address}: {type(exc).__name__}: {exc}")
            finally:
                connection.close()
            time.sleep(0.02)


def _under_load(config: str, plan_store: str) -> str:
    """test_manager_ha's configuration, with the plan in the one Redis every DNS host reads,
    servers that send 16 KiB a second (a request of 8 KB takes about half a second, so the
    users keep a server busy) and a pool that starts with one server and scales out on load."""
    changes = {
        "plan: {refresh: 1,": f'plan: {{store: "{plan_store}", refresh: 1,',
        "report_interval: 0.5": "report_interval: 0.5\n      send_rate: 16384",
        f"min_servers: {SERVERS}, max_servers: {SERVERS}, th_high: 0.9": (
            f"min_servers: 1, max_servers: {SERVERS}, th_high: 0.6"
        ),
    }
    for old, new in changes.items():
        assert old in config, old
        config = config.replace(old, new)
    return config


def _plan_epoch(store: PlanStore) -> int | None:
    """The epoch of the plan in Redis, read as a pipe backend reads it; None when none is."""
    try:
        return store.read().epoch
    except (OSError, PlanError):
        return None


def test_kill_the_leader_during_a_scale_out_under_load(tmp_path: Path, shared: Path) -> None:  # noqa: F811
    root = shared / "providers" / "www"
    port = free_port()
    store = Redis(free_port(), tmp_path / "redis", None)
    (tmp_path / "redis").mkdir()
    store.start()
    dns: PdnsServer | None = None
    users: Users | None = None
    reader: PlanStore | None = None
    try:
        with postgres_cluster() as cluster, Origin() as origin:
            a = manager_in(tmp_path, "a", shared, cluster, origin.url, port)
            b = manager_in(tmp_path, "b", shared, cluster, origin.url, port)
            for manager in (a, b):
                manager.config = _under_load(manager.config, store.url())
            peers(a, b)
            a.start()
            try:
                lead_then_stand_by(a, b)
                reader = open_store(store.url())
                _first(lambda: _plan_epoch(reader) == 1, "a publishes")
                dns = PdnsServer(PdnsSettings(plan=store.url(), port=free_port()), tmp_path / "dns")
                dns.start(probe_name="example.test")
                # Users come once the first server serves and keep it busy: a scales out (one
                # launch at a time); kill it while that launch is under way.
                probe = Resolver(dns.settings.port)
                _first(lambda: bool(probe.ask(NAME)[0]), "a first server in the answers")
                users = Users(dns.settings.port, port)
                users.start()
                _first(
                    lambda: any(state == "launching" for state, _ in servers(cluster).values()),
                    "a launch under way",
                )
                time.sleep(0.5)  # requests in flight on the first server(s)
                killed, leading = kill_the_leader(a, b)
                _first(lambda: _plan_epoch(reader) == 2, "b publishes")
                published = time.monotonic() - killed
                _first(
                    lambda: (
                        sum(
                            1
                            for state, _ in servers(cluster).values()
                            if state in ("warming", "active")
                        )
                        >= 2
                        and not any(state == "launching" for state, _ in servers(cluster).values())
                    ),
                    "the scale-out finished under b",
                )
                time.sleep(2.0)  # the users go on against the grown pool
                users.finish()
                print(
                    f"\nkill -9 -> standby leads: {leading:.2f} s (lease 3 s); -> its first plan "
                    f"in Redis: {published:.2f} s; users: {dict(users.outcomes)}"
                )
                assert users.outcomes["ok"] > 50, users.outcomes
                assert users.outcomes["failed"] == 0, users.failures
                assert users.outcomes["dns failed"] == 0, users.failures
                found = servers(cluster)
                live = {sid for sid, (state, _) in found.items() if state != "terminated"}
                cut_short = {sid for sid, (_, why) in found.items() if "cut short" in why}
                # Launched twice: more servers than the pool may have (b not knowing a's
                # launches), other than launches that never reached the provider.
                assert len(found) - len(cut_short) <= SERVERS, found
                assert server_dirs(root) == live  # none orphaned
                assert lab_processes(root) <= recorded_pids(root, live)
                assert b.stop() == 0
                _first(lambda: not lab_processes(root), "the servers stopped with b", 15)
            finally:
                if users is not None:
                    users.finish()
                b.stop()
                a.stop()
    finally:
        if reader is not None:
            reader.close()
        if dns is not None:
            dns.stop()
        store.stop()
